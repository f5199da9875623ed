"""A conversation started with an earlier version (issue 36 point 2, attack 5;
docs/protocol.md §13): its checkout is a worktree of the PERSON's repository, so
a run of it could write the person's object store and move every other
conversation's ``prohost/*`` branch. The harness moves such a worktree to a
repository of the conversation's own at its next run, before anything of the run
starts, keeping its files, staged and untracked work as they were.

Everything is real: the reference server, the harness, git, bubblewrap and
Landlock. The lane folder is built exactly as the earlier version built it
(:func:`make_legacy_lane`); the agent is ``tests/agents/hostile_git.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from prohost.engine.repos import migrate
from prohost.engine.repos.lanerepo import lane_repo
from tests.kits.full_confinement import SECTION_13_CONFINED
from tests.kits.harness import running_harness, running_server
from tests.kits.hostile_git import (
    DENIED_WRITE,
    HOSTILE,
    World,
    reply,
    turn,
)
from tests.kits.legacy import make_legacy_lane
from tests.kits.repos import git, isolate_git, make_repo

pytestmark = SECTION_13_CONFINED


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    isolate_git(tmp_path, monkeypatch)
    yield World(tmp_path)


async def test_a_conversation_of_an_earlier_version_writes_nothing_of_the_person_s(
    world: World,
) -> None:
    """Attack 5 on a conversation whose worktree an earlier version made: its run
    overwrites the loose object of ``main:Makefile`` and moves another
    conversation's branch. Before its run the harness moved it to a repository of
    its own: the person's Makefile and the other branch are as they were, and
    the worktree's ``.git`` names the conversation's own repository."""
    await make_repo(world.source, {"Makefile": "all:\n\techo hello\n"})
    makefile = world.git("show", "main:Makefile")
    path = await make_legacy_lane(world.home, world.source, "conv:L")
    (path / "staged.txt").write_text("staged only\n")
    await git(path, "add", "staged.txt")
    await make_legacy_lane(world.home, world.source, "conv:O")
    other = world.git("rev-parse", world.branch("O")).strip()
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, world.home, exec_command=HOSTILE, brain="plain", env=world.env,
            repos=(world.source,),
        ):
            overwritten = reply(await turn(server, "L", "object"))
            # Moved, if at all, in the conversation's own repository only.
            await turn(server, "L", "move", world.branch("O"))
    assert world.git("show", "main:Makefile") == makefile
    assert world.git("rev-parse", world.branch("O")).strip() == other
    assert overwritten in DENIED_WRITE
    repo = lane_repo(path.parent, path.name)
    assert (path / ".git").read_text() == f"gitdir: {repo.resolve()}/worktrees/app\n"
    world.git("fsck", "--no-progress")
    # The staged blob was packed into the conversation's own store (its index
    # read inside a confinement): the person's gc of all unreachable takes nothing.
    world.git("reflog", "expire", "--expire=now", "--all")
    world.git("gc", "--quiet", "--prune=now")
    assert await git(path, "show", ":staged.txt") == "staged only\n"


async def test_a_move_that_fails_fails_the_run_retryable_and_the_next_one_moves_it(
    world: World, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The move cannot be made (git refusing to fetch the branch): the run fails
    before its agent starts, retryable, saying why without a local path, and
    the worktree is as it was (uncommitted work too). The next run moves it,
    and its agent works on the same files."""
    await make_repo(world.source)
    path = await make_legacy_lane(world.home, world.source, "conv:L")
    (path / "draft.txt").write_text("uncommitted work\n")
    dot_git = (path / ".git").read_bytes()
    real = migrate.fetch_branches

    async def refused(*args: object) -> None:
        raise migrate.GitError(f"cannot lock ref in {world.source}")

    monkeypatch.setattr(migrate, "fetch_branches", refused)
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, world.home, exec_command=HOSTILE, brain="plain", env=world.env,
            repos=(world.source,),
        ):
            failed = await turn(server, "L", "read", str(path / "draft.txt"))
            assert (path / ".git").read_bytes() == dot_git
            monkeypatch.setattr(migrate, "fetch_branches", real)
            read = reply(await turn(server, "L", "read", "draft.txt"))
    assert failed["ok"] is False
    assert failed["retryable"] is True
    assert "could not be moved to a repository of the conversation's own" in failed["error"]
    assert str(world.tmp) not in failed["error"]
    assert read == "content: uncommitted work"
    assert (path / ".git").read_text().startswith(
        f"gitdir: {(path.parent / '.prohost-repos').resolve()}")
    assert str(path) not in await git(world.source, "worktree", "list")
