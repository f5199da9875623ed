"""Fixtures of the repos room's tests; helpers are in tests/kits/repos.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from prohost.engine.repos.gitsession import ConfinedGit
from prohost.engine.sandbox import probe
from tests.kits.gitconfine import bwrap_confine
from tests.kits.repos import isolate_git


@pytest.fixture
def isolated_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """:func:`~tests.kits.repos.isolate_git` for the test (modules that make their
    repositories with tests/kits/repos.py use it for every test)."""
    isolate_git(tmp_path, monkeypatch)




@pytest.fixture
def bubblewrap_here() -> None:
    """Skip where bubblewrap cannot confine, saying why: a sync fixture, so the skip
    happens before trio starts and keeps its reason."""
    support = probe()
    if support.kind != "bwrap":
        pytest.skip(f"no bubblewrap confinement here: {support.reason}")


@pytest.fixture
async def confined_git(tmp_path: Path, bubblewrap_here: None) -> AsyncIterator[ConfinedGit]:
    """A :class:`ConfinedGit` that reads ``tmp_path`` (skips where bubblewrap cannot run)."""
    async with ConfinedGit(bwrap_confine(), [tmp_path], tmp_path / "scratch") as run:
        yield run
