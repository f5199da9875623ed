"""A conversation's worktree made by an earlier version — a worktree of the
person's repository — moved into a repository of the conversation's own at its
next prepare (§13, issue 36 point 2; prohost/engine/repos/migrate.py), with real
git in tmp_path: nothing of its work is lost, and a move interrupted at any step
leaves what the next prepare completes."""

from __future__ import annotations

import inspect
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from prohost.engine.repos import migrate
from prohost.engine.repos.lanemarker import LANE_MARKER, read_marker
from prohost.engine.repos.lanerepo import lane_repo
from prohost.engine.repos.worktrees import WorktreeManager, lane_folder_name

#: No git configuration of the machine reaches this module's repositories.
from tests.kits.legacy import (
    LANE,
    STEPS,
    Legacy,
    files_of,
    legacy_fixture,  # noqa: F401 (a fixture)
    make_legacy_lane,
    single,
)
from tests.kits.repos import commit_file, git, make_repo

pytestmark = [pytest.mark.usefixtures("isolated_git"), pytest.mark.protocol("§13")]













async def test_the_move_keeps_every_piece_of_work(legacy: Legacy,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "prohost.worktrees")
    with trio.fail_after(30):
        prepared = await legacy.manager().prepare(LANE)
        checkout = single(prepared.checkouts)
        assert prepared.failures == ()
        assert checkout.branch == legacy.branch
        await legacy.assert_moved()
        assert "moved the conversation's checkout" in caplog.text
        # What only the old worktree kept alive in the person's store (the
        # staged blobs) is the conversation's own now: the person's gc of
        # everything unreachable takes none of it.
        await git(legacy.source, "reflog", "expire", "--expire=now", "--all")
        await git(legacy.source, "gc", "--quiet", "--prune=now")
        assert (await git(legacy.path, "show", ":new.txt")) == "only staged, never committed\n"
        assert (await git(legacy.path, "show", ":notes.txt")) == "staged version\n"
        await git(legacy.path, "fsck", "--no-progress")
        # And the next prepare finds it a worktree of the lane's own, as it is.
        again = await legacy.manager().prepare(LANE)
        assert single(again.checkouts).branch == legacy.branch
        await legacy.assert_moved()


async def test_a_detached_commit_of_the_old_worktree_survives_the_person_s_gc(
    tmp_path: Path,
) -> None:
    with trio.fail_after(30):
        source = await make_repo(tmp_path / "app")
        home = tmp_path / "home"
        path = await make_legacy_lane(home, source, LANE)
        await git(path, "switch", "-q", "--detach")
        detached = await commit_file(path, "lost.txt", "only on a detached HEAD\n")
        prepared = await WorktreeManager(home, [source]).prepare(LANE)
        assert single(prepared.checkouts).branch is None  # detached, as the agent left it
        await git(source, "reflog", "expire", "--expire=now", "--all")
        await git(source, "gc", "--quiet", "--prune=now")
        assert (await git(path, "rev-parse", "HEAD")).strip() == detached
        assert (await git(path, "show", "HEAD:lost.txt")) == "only on a detached HEAD\n"
        await git(path, "fsck", "--no-progress")


async def test_a_conversation_of_an_empty_repository_is_moved_unborn(tmp_path: Path) -> None:
    with trio.fail_after(30):
        source = tmp_path / "app"
        source.mkdir()
        await git(source, "init", "-q", "-b", "main")
        home = tmp_path / "home"
        folder = home / "worktrees" / lane_folder_name(LANE)
        path = folder / "app"
        # What the earlier version made of a repository with no commit.
        empty = (await git(source, "hash-object", "-t", "tree", "-w", "/dev/null")).strip()
        stand_in = (await git(source, "commit-tree", empty, "-m", "stand-in")).strip()
        await git(source, "worktree", "add", "--detach", str(path), stand_in)
        await git(path, "symbolic-ref", "HEAD", f"refs/heads/prohost/{folder.name}")
        (folder / LANE_MARKER).write_text(json.dumps(
            {"lane": LANE, "last_used": time.time(), "ready": {"app": str(source)}}))
        (path / "first.txt").write_text("staged in an empty repository\n")
        await git(path, "add", "first.txt")
        prepared = await WorktreeManager(home, [source]).prepare(LANE)
        assert prepared.failures == ()
        assert (await git(path, "show", ":first.txt")) == "staged in an empty repository\n"
        head = (await git(path, "symbolic-ref", "HEAD")).strip()
        assert head == f"refs/heads/prohost/{folder.name}"
        assert not (source / ".git" / "worktrees" / "app").exists()


#: Steps after which the move is recorded: the next prepare finishes it.
RECORDED = {"record_move", "point", "forget"}


def failing(real: Callable[..., Any], after: bool) -> Callable[..., Any]:
    """``real``, failing before it does anything, or after it has done all (as a
    harness killed there leaves it)."""
    if inspect.iscoroutinefunction(real):
        async def broken_async(*args: Any) -> Any:
            if after:
                await real(*args)
            raise OSError(5, "injected failure")
        return broken_async

    def broken(*args: Any) -> Any:
        if after:
            real(*args)
        raise OSError(5, "injected failure")
    return broken


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
@pytest.mark.parametrize(("module", "step"), STEPS, ids=[name for _, name in STEPS])
async def test_a_move_interrupted_at_any_step_is_completed_by_the_next_prepare(
    legacy: Legacy, monkeypatch: pytest.MonkeyPatch, module: Any, step: str, after: bool,
) -> None:
    with trio.fail_after(30):
        real = getattr(module, step)
        monkeypatch.setattr(module, step, failing(real, after))
        prepared = await legacy.manager().prepare(LANE)
        monkeypatch.setattr(module, step, real)
        if step == "forget":
            # Moved and handed over; what is left in the person's repository (or
            # the marker's note of it) goes at the next prepare.
            assert single(prepared.checkouts).branch == legacy.branch
        else:
            failure = single(prepared.failures)
            assert failure.retryable
            assert "injected failure" in failure.reason
            assert "the next run tries again" in failure.reason
            if step not in RECORDED:
                await legacy.assert_untouched()
        again = await legacy.manager().prepare(LANE)
        assert again.failures == ()
        assert single(again.checkouts).branch == legacy.branch
        await legacy.assert_moved()


async def test_an_index_naming_an_object_no_store_holds_is_moved_as_it_is(
    legacy: Legacy,
) -> None:
    """A run of the earlier version left an index entry whose blob exists nowhere:
    nothing to keep of it, and the move is not refused for it (a conversation
    would otherwise fail every run)."""
    with trio.fail_after(30):
        ghost = "1234567890" * 4
        await git(legacy.path, "update-index", "--add", "--cacheinfo",
                  f"100644,{ghost},ghost.txt")
        prepared = await legacy.manager().prepare(LANE)
        assert prepared.failures == ()
        assert ghost in await git(legacy.path, "ls-files", "--stage", "ghost.txt")
        assert (await git(legacy.path, "show", ":notes.txt")) == "staged version\n"


async def test_links_a_run_left_in_the_old_git_dir_are_never_followed(legacy: Legacy) -> None:
    """A run of the earlier version made its git dir's ``HEAD`` and ``index`` links
    to a secret: the move reads neither through the link (the worktree goes on
    its branch, with no index), and no file of the new git dir holds the secret."""
    with trio.fail_after(30):
        secret = legacy.tmp / "secret"
        secret.write_text("ref: refs/heads/secret-4711\n")
        for name in ("HEAD", "index"):
            (legacy.old_git_dir / name).unlink()
            (legacy.old_git_dir / name).symlink_to(secret)
        prepared = await legacy.manager().prepare(LANE)
        assert single(prepared.checkouts).branch == legacy.branch
        git_dir = lane_repo(legacy.path.parent, "app") / "worktrees" / "app"
        for path in git_dir.rglob("*"):
            assert not path.is_symlink(), path
            assert not path.is_file() or b"secret-4711" not in path.read_bytes(), path
        assert files_of(legacy.path) == legacy.files


async def test_a_move_recorded_then_failed_stays_recorded_beside_another_checkout(
    legacy: Legacy, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two checkouts of an earlier version in one conversation: ``app``'s move is
    recorded and then fails, ``lib``'s succeeds. What the prepare records of
    ``lib`` keeps ``app``'s record, so the next prepare finishes ``app``'s move
    instead of taking its old git dir for its own."""
    with trio.fail_after(30):
        lib = await make_repo(legacy.tmp / "lib")
        lib_path = await make_legacy_lane(legacy.home, lib, LANE)
        marker = json.loads((lib_path.parent / LANE_MARKER).read_text())
        marker["ready"] = {"app": str(legacy.source), "lib": str(lib)}
        (lib_path.parent / LANE_MARKER).write_text(json.dumps(marker))
        real = migrate.point

        def point(places: Any) -> None:
            real(places)
            if places.work_tree == str(legacy.path):  # done, then failed
                raise OSError(5, "injected failure")

        monkeypatch.setattr(migrate, "point", point)
        manager = WorktreeManager(legacy.home, [legacy.source, lib])
        prepared = await manager.prepare(LANE)
        assert single(prepared.failures).retryable
        assert single(prepared.checkouts).name == "lib"
        monkeypatch.setattr(migrate, "point", real)
        again = await WorktreeManager(legacy.home, [legacy.source, lib]).prepare(LANE)
        assert again.failures == ()
        marker_now = read_marker(legacy.path.parent)
        assert marker_now.git_dirs is not None
        assert set(marker_now.git_dirs) == {"app", "lib"}
        assert not marker_now.moved
        assert files_of(legacy.path) == legacy.files
        assert await legacy.porcelain() == legacy.status
        assert (await git(legacy.path, "show", ":notes.txt")) == "staged version\n"
