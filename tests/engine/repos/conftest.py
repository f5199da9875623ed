"""Fixtures of the repos room's tests; helpers are in tests/kits/repos.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from prohost.engine.repos.gitsession import Confine, ConfinedGit
from prohost.engine.sandbox import Policy, confined_command, probe
from tests.kits.repos import isolate_git


@pytest.fixture
def isolated_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """:func:`~tests.kits.repos.isolate_git` for the test (modules that make their
    repositories with tests/kits/repos.py use it for every test)."""
    isolate_git(tmp_path, monkeypatch)


def bwrap_confine(hidden: tuple[Path, ...] = ()) -> Confine:
    """The harness's way to confine its git on a run's places
    (:func:`prohost.engine.run.checkouts.git_confinement`), with ``hidden`` hidden."""

    def confine(argv: list[str], readable: Sequence[Path],
                writable: Sequence[Path]) -> list[str]:
        policy = Policy(writable=tuple(writable), readable=tuple(readable), hidden=hidden)
        return confined_command(policy, argv)

    return confine


@pytest.fixture
async def confined_git(tmp_path: Path) -> AsyncIterator[ConfinedGit]:
    """A :class:`ConfinedGit` that reads ``tmp_path`` (skips where bubblewrap cannot run)."""
    support = probe()
    if support.kind != "bwrap":
        pytest.skip(f"no bubblewrap confinement here: {support.reason}")
    async with ConfinedGit(bwrap_confine(), [tmp_path], tmp_path / "scratch") as run:
        yield run
