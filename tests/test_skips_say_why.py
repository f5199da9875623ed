"""Every skip in the suite says why it skipped (which CLI is missing, which kernel
feature), in the summary a person reads.

Read from the tests' source: each ``pytest.skip`` gives a reason, each ``skipif`` a
``reason=``, and no ``pytest.skip`` is called inside an ``async def`` (a test or
fixture trio runs), where trio loses the reason and pytest shows
``_pytest/python.py: Skipped``. A skip that still comes without one at run time
(raised by a helper an async test calls) fails: tests/conftest.py's
``pytest_runtest_makereport``.
"""

from __future__ import annotations

import ast

from tests.kits.paths import TESTS


def _skips(tree: ast.AST) -> list[tuple[ast.Call, bool]]:
    """Every skip call in ``tree``, and whether it is inside an ``async def``."""
    found: list[tuple[ast.Call, bool]] = []

    def walk(node: ast.AST, in_async: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_async
            if isinstance(child, ast.AsyncFunctionDef):
                inside = True
            elif isinstance(child, ast.FunctionDef | ast.Lambda):
                inside = False
            if isinstance(child, ast.Call) and ast.unparse(child.func).endswith(
                    ("pytest.skip", "mark.skipif", "mark.skip", "importorskip")):
                found.append((child, inside))
            walk(child, inside)

    walk(tree, False)
    return found


def problems_in(source: str, name: str) -> list[str]:
    problems = []
    for call, in_async in _skips(ast.parse(source)):
        where = f"{name}:{call.lineno}"
        function = ast.unparse(call.func)
        keywords = {keyword.arg for keyword in call.keywords}
        if function.endswith("pytest.skip"):
            if not call.args and "reason" not in keywords:
                problems.append(f"{where}: pytest.skip() without a reason")
            if in_async:
                problems.append(f"{where}: pytest.skip inside an async def loses its "
                                "reason; skip in a mark or a sync fixture")
        elif function.endswith(("mark.skipif", "mark.skip")) and "reason" not in keywords:
            problems.append(f"{where}: {function} without reason=")
        elif function.endswith("importorskip") and "reason" not in keywords:
            problems.append(f"{where}: importorskip without reason=")
    return problems


def test_every_skip_in_the_suite_says_why() -> None:
    problems = []
    for path in sorted(TESTS.rglob("*.py")):
        problems += problems_in(path.read_text(), str(path.relative_to(TESTS)))
    assert problems == []


def test_the_reader_finds_each_kind_of_unexplained_skip() -> None:
    source = '''
import pytest

@pytest.mark.skipif(True)
def test_a(): pytest.skip()

async def test_b():
    pytest.skip("said, but lost inside trio")
'''
    problems = problems_in(source, "x.py")
    assert [problem.split(": ", 1)[0] for problem in problems] == ["x.py:5", "x.py:4", "x.py:8"]


def test_a_skip_with_its_reason_and_outside_trio_is_fine() -> None:
    source = '''
import pytest

pytestmark = pytest.mark.skipif(True, reason="no bubblewrap here")

@pytest.fixture
def cli():
    pytest.skip("the real claude CLI is not installed")
'''
    assert problems_in(source, "x.py") == []
