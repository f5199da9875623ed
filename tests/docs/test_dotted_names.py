"""Docstrings and comments name only functions that exist (issue 16, point 7).

A renamed function left behind in prose sends the next reader looking for code
that is not there. Every dotted ``prohost.…`` name in the checked modules must
resolve by import and attribute lookup.
"""

from __future__ import annotations

import importlib
import re

import pytest

from tests.kits.paths import ROOT

CHECKED = ["prohost/engine/run/heldrun.py"]
NAME = re.compile(r"\bprohost(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


@pytest.mark.parametrize("module", CHECKED)
def test_every_dotted_name_in_the_module_exists(module: str) -> None:
    names = set(NAME.findall((ROOT / module).read_text(encoding="utf-8")))
    assert names, f"{module} names nothing to check"
    assert sorted(name for name in names if not resolves(name)) == []
