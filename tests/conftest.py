"""Fixtures any test may use; helpers are in tests/kits/, and each folder's
conftest.py has the fixtures of its own tests.

Every test runs with ``HOME`` set to an empty folder of the test process's own,
never the person's: nothing the suite starts (the harness, the demo, an agent CLI
asked its version) may make anything there, and :func:`home_left_alone` fails the
test after which something appeared in it. The folder is in the clone's
``.cache/``, not under /tmp, where Codex refuses to make its folder and the check
would see nothing.

A skip must say why (which CLI is missing, which kernel feature):
:func:`pytest_runtest_makereport` turns one that does not (a bare
``pytest.skip()``, or one raised inside trio, which loses its reason and is shown
as ``_pytest/python.py: Skipped``) into a failure naming the test.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kits.paths import ROOT

#: Where each test process's own ``HOME`` is made.
HOMES = ROOT / ".cache" / "test-homes"

_made_home: Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _made_home
    HOMES.mkdir(parents=True, exist_ok=True)
    _made_home = Path(tempfile.mkdtemp(prefix="home-", dir=HOMES))
    os.environ["HOME"] = str(_made_home)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _made_home is not None:
        shutil.rmtree(_made_home, ignore_errors=True)


def _entries(home: Path) -> set[str]:
    """Every path under ``home`` (a folder made there empty counts too)."""
    return {str(path.relative_to(home)) for path in home.rglob("*")}


#: What a skip's reason reads when none was given (or trio lost it).
_NO_REASON = {"", "Skipped", "Skipped:"}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    longrepr = report.longrepr
    if not isinstance(longrepr, tuple) or len(longrepr) != 3:
        return
    path, _, reason = longrepr
    reason = str(reason).strip()
    if reason in _NO_REASON or "/_pytest/" in str(path):
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} was skipped without saying why ({path}: {reason!r}): give "
            "pytest.skip or skipif a reason (which CLI is missing, which kernel "
            "feature), and skip before trio starts (a mark or a sync fixture), where "
            "the reason is kept")


@pytest.fixture(autouse=True)
def home_left_alone() -> Iterator[None]:
    """Fail the test after which the person's home (this process's ``HOME``) holds
    something it did not hold before: prohost never makes the person's CLI folders
    (``~/.claude``, ``~/.codex``) nor anything else there."""
    home = Path(os.environ["HOME"])
    before = _entries(home)
    yield
    made = sorted(_entries(home) - before)
    if made:
        for name in made:  # the next test starts from the same home
            shutil.rmtree(home / name, ignore_errors=True)
            (home / name).unlink(missing_ok=True)
        pytest.fail(f"the test left {', '.join(made[:10])} in the home folder ({home})",
                    pytrace=False)


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The common default umask, under which files and folders are world-readable."""
    old = os.umask(0o022)
    yield
    os.umask(old)
