"""The test suite's own house rule: no test module imports another test module or a
``conftest.py`` (what several share lives in ``tests/kits``), so each test module can
be read, moved and run on its own, with or without pytest-xdist."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _is_test_module(dotted: str) -> bool:
    last = dotted.rsplit(".", 1)[-1]
    return dotted.startswith("tests.") and (last.startswith("test_") or last == "conftest")


def test_no_test_module_imports_another() -> None:
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                # `from .conftest import …` / `from . import test_x`: inside tests/
                module = "tests." + (node.module or "")
                names = [module] + [f"{module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            if any(_is_test_module(name) for name in names):
                found.append(f"{path.relative_to(TESTS.parent)}:{node.lineno}")
    assert found == [], "move what they share into tests/kits: " + ", ".join(found)
