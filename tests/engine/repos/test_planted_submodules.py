"""A run plants a submodule whose repository names a filter program (§13, a
variant of issue 36's attack 1): the harness's git reads the worktree's changes
at the run's end and judges it in gc, and the planted program runs at neither.

Before the fix, ``git status --ignore-submodules=none`` ran ``git status``
inside the planted repository, with its config: the filter ran unconfined.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import trio

from prohost.engine.repos.changes import CheckoutReader
from prohost.engine.repos.collect import collect_garbage
from prohost.engine.repos.worktrees import WorktreeManager
from prohost.wire.changes import CheckoutChanges
from tests.kits.repos import make_repo, only

pytestmark = pytest.mark.usefixtures("isolated_git")

DAY = 86400.0


def run(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True)


def plant(worktree: Path, marker: Path, outside: Path) -> None:
    """What a hostile run leaves: ``sub`` a repository of its own whose config
    sets a clean filter for every file, a file in it whose times changed (so git
    must filter it to compare), and ``sub`` staged as a submodule."""
    sub = worktree / "sub"
    sub.mkdir()
    run(sub, "init", "-q")
    (sub / "f").write_text("hi\n")
    run(sub, "add", "f")
    run(sub, "commit", "-q", "-m", "s")
    program = outside / "filter.sh"
    program.write_text(f"#!/bin/sh\necho ran >> '{marker}'\ncat\n")
    program.chmod(0o755)
    run(sub, "config", "filter.x.clean", str(program))
    (sub / ".git" / "info").mkdir(exist_ok=True)
    (sub / ".git" / "info" / "attributes").write_text("* filter=x\n")
    (sub / "f").write_text("hi\n")  # its size as committed: only its content tells
    subprocess.run(["touch", "-d", "2001-01-01", str(sub / "f")], check=True)
    run(worktree, "add", "sub")


async def test_a_planted_submodule_s_filter_never_runs(tmp_path: Path) -> None:
    with trio.fail_after(30):
        source = await make_repo(tmp_path / "app")
        home = tmp_path / "home"
        outside = tmp_path / "outside"
        outside.mkdir()
        marker = outside / "ran"
        manager = WorktreeManager(home, [source])
        prepared = await manager.prepare("conv:1")
        path = only(prepared.checkouts)
        places = prepared.checkouts[0].git
        before = await CheckoutReader().state("app", path, places=places)
        plant(path, marker, outside)
        entry = await CheckoutReader().compare(before)
        assert isinstance(entry, CheckoutChanges)
        assert [change.path for change in entry.files] == ["sub"]
        assert not marker.exists(), "the run's changes ran the planted filter"
        entries = await collect_garbage(home, older_than_s=DAY, dry_run=False, force=False,
                                        now=time.time() + 30 * DAY)
        assert not marker.exists(), "gc ran the planted filter"
        assert [entry.action for entry in entries] == ["kept-dirty"]
        assert "checked-out submodule (sub)" in entries[0].detail
