"""scripts/mutation_check.py's list stays true (issue 27, point 9).

The check itself runs the fault matrix once per breakage (minutes; CI's slow step).
Here, cheaply, in every default run: every breakage's old text still occurs exactly
once in today's code, and the edited file still compiles, so that a refactoring that
moves a line says so at once rather than when the slow check next runs.
"""

from __future__ import annotations

import pytest

from tests.kits.paths import ROOT
from tests.kits.scripts import load_script

check = load_script("mutation_check")


@pytest.mark.parametrize("breakage", check.BREAKAGES, ids=lambda b: b.name)
def test_every_breakage_still_applies_to_today_s_code(breakage: object) -> None:
    assert check.check_edits(ROOT, breakage) is None
    assert check.compiles(ROOT, breakage) is None


def test_the_list_is_whole() -> None:
    names = [b.name for b in check.BREAKAGES]
    assert len(names) == len(set(names)) >= 19
    assert set(check.QUICK) <= set(names)
    for path in check.TESTS:
        assert (ROOT / path).is_file(), path
    for breakage in check.BREAKAGES:
        for edit in breakage.edits:
            assert edit.path.startswith("prohost/") and edit.old != edit.new
