"""Clearing away idle conversations' worktrees: `collect_garbage` and `prohost agent gc`."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from prohost.commands.gc import (
    DEFAULT_OLDER_THAN_DAYS,
    format_entries,
    gc_command,
    parse_older_than,
)
from prohost.engine.lanes.scheduler import Scheduler, Slot
from prohost.engine.repos.collect import GcEntry, collect_garbage
from prohost.engine.repos.lanemarker import LANE_MARKER
from prohost.engine.repos.worktrees import WorktreeManager
from prohost.engine.supervisor import upkeep
from tests.kits.repos import commit_file, git, lanes, make_repo, real, worktree_paths

DAY = 86400.0
LATER = 30 * DAY  # how far ahead `now` is put: every lane is then 30 days idle


#: No git configuration of the machine reaches this module's repositories.
pytestmark = pytest.mark.usefixtures("isolated_git")


def by_lane(entries: list[GcEntry], field: str = "action") -> dict[str | None, str]:
    return {entry.lane: getattr(entry, field) for entry in entries}


@pytest.mark.protocol("§5")
async def test_clean_idle_worktrees_go_and_work_stays(tmp_path: Path) -> None:
    with trio.fail_after(20):
        setup = await lanes(tmp_path, "conv:clean", "conv:dirty", "conv:unmerged",
                            "conv:branch", "conv:recent", "conv:busy")
        paths = setup.paths
        (paths["conv:dirty"] / "notes.txt").write_text("untracked work\n")
        # Off the lane's branch: a commit on a detached HEAD is on no branch.
        await git(paths["conv:unmerged"], "switch", "-q", "--detach")
        await commit_file(paths["conv:unmerged"], "x.txt", "on a detached HEAD\n")
        await git(paths["conv:branch"], "switch", "-q", "-c", "feature")
        await commit_file(paths["conv:branch"], "y.txt", "on a branch of its own\n")
        now = time.time() + LATER
        marker = setup.folder("conv:recent") / LANE_MARKER
        data = json.loads(marker.read_text())
        marker.write_text(json.dumps({**data, "last_used": now - DAY}))

        entries = await collect_garbage(
            setup.home, older_than_s=14 * DAY, dry_run=False, force=False,
            busy=lambda lane: lane == "conv:busy", now=now,
        )
        assert by_lane(entries) == {
            "conv:clean": "removed",
            "conv:dirty": "kept-dirty",
            "conv:unmerged": "kept-unmerged",
            # Its commits are on a branch of the conversation's own repository
            # only: the harness brings back prohost/<lane>, nothing else.
            "conv:branch": "kept-unmerged",
            "conv:recent": "kept-recent",
            "conv:busy": "kept-busy",
        }
        details = by_lane(entries, "detail")
        assert "uncommitted changes (1 file)" in details["conv:dirty"]
        assert "commits on no branch" in details["conv:unmerged"]
        assert "does not have yet" in details["conv:branch"]
        entry = next(e for e in entries if e.lane == "conv:clean")
        assert entry.worktrees == (paths["conv:clean"],)
        assert 29 * DAY < entry.idle_s < 31 * DAY

        assert not setup.folder("conv:clean").exists()
        kept = ("conv:dirty", "conv:unmerged", "conv:branch", "conv:recent", "conv:busy")
        assert sorted(await worktree_paths(setup.source, setup.home)) == real(
            setup.source, *(paths[lane] for lane in kept)
        )
        assert (paths["conv:dirty"] / "notes.txt").exists()


async def test_dry_run_changes_nothing(tmp_path: Path) -> None:
    with trio.fail_after(20):
        setup = await lanes(tmp_path, "conv:a", "conv:b")
        (setup.paths["conv:b"] / "README").write_text("changed\n")
        before = await worktree_paths(setup.source, setup.home)
        listing = sorted(p.relative_to(setup.home) for p in setup.home.rglob("*")
                         if ".git" not in p.parts)
        entries = await collect_garbage(
            setup.home, older_than_s=DAY, dry_run=True, force=False, now=time.time() + LATER
        )
        assert by_lane(entries) == {"conv:a": "would-remove", "conv:b": "kept-dirty"}
        forced = await collect_garbage(
            setup.home, older_than_s=DAY, dry_run=True, force=True, now=time.time() + LATER
        )
        assert by_lane(forced) == {"conv:a": "would-remove", "conv:b": "would-remove"}
        assert "forced" in by_lane(forced, "detail")["conv:b"]
        assert await worktree_paths(setup.source, setup.home) == before
        assert listing == sorted(p.relative_to(setup.home) for p in setup.home.rglob("*")
                                 if ".git" not in p.parts)


async def test_force_removes_dirty_and_unmerged_worktrees(tmp_path: Path) -> None:
    with trio.fail_after(20):
        setup = await lanes(tmp_path, "conv:dirty", "conv:unmerged")
        (setup.paths["conv:dirty"] / "README").write_text("changed\n")
        await commit_file(setup.paths["conv:unmerged"], "x.txt", "lost\n")
        entries = await collect_garbage(
            setup.home, older_than_s=DAY, dry_run=False, force=True, now=time.time() + LATER
        )
        assert by_lane(entries) == {"conv:dirty": "removed", "conv:unmerged": "removed"}
        assert await worktree_paths(setup.source, setup.home) == real(setup.source)
        assert list((setup.home / "worktrees").iterdir()) == []


async def test_recently_used_and_busy_lanes_are_not_even_inspected(tmp_path: Path) -> None:
    with trio.fail_after(20):
        setup = await lanes(tmp_path, "conv:a", "conv:b")
        asked: list[str] = []

        def busy(lane: str) -> bool:
            asked.append(lane)
            return lane == "conv:b"

        entries = await collect_garbage(
            setup.home, older_than_s=DAY, dry_run=False, force=True, busy=busy
        )
        assert by_lane(entries) == {"conv:a": "kept-recent", "conv:b": "kept-busy"}
        assert sorted(asked) == ["conv:a", "conv:b"]
        assert len(await worktree_paths(setup.source, setup.home)) == 3


async def test_a_worktree_whose_repository_is_gone_is_kept_unless_forced(
    tmp_path: Path,
) -> None:
    with trio.fail_after(20):
        setup = await lanes(tmp_path, "conv:a")
        await trio.to_thread.run_sync(shutil.rmtree, setup.source)
        kept = await collect_garbage(
            setup.home, older_than_s=DAY, dry_run=False, force=False, now=time.time() + LATER
        )
        assert by_lane(kept) == {"conv:a": "kept-dirty"}
        assert "cannot be checked" in kept[0].detail
        gone = await collect_garbage(
            setup.home, older_than_s=DAY, dry_run=False, force=True, now=time.time() + LATER
        )
        assert by_lane(gone) == {"conv:a": "removed"}
        assert not setup.folder("conv:a").exists()


async def test_other_files_in_a_lane_folder_keep_it(tmp_path: Path) -> None:
    with trio.fail_after(20):
        setup = await lanes(tmp_path, "conv:a")
        (setup.folder("conv:a") / "plan.md").write_text("the agent's notes\n")
        kept = await collect_garbage(
            setup.home, older_than_s=DAY, dry_run=False, force=False, now=time.time() + LATER
        )
        assert by_lane(kept) == {"conv:a": "kept-dirty"}
        assert "plan.md" in kept[0].detail
        assert len(await worktree_paths(setup.source, setup.home)) == 2


async def test_a_folder_without_a_marker_is_judged_by_its_age_and_kept_unchecked(
    tmp_path: Path,
) -> None:
    """Without its marker the harness has no record of the worktree's git dir, and
    its ``.git`` is a file a run could have written (§13): it is not checked, so
    it is kept unless forced, and removed when forced."""
    with trio.fail_after(20):
        setup = await lanes(tmp_path, "conv:a")
        (setup.folder("conv:a") / LANE_MARKER).unlink()
        entries = await collect_garbage(
            setup.home, older_than_s=DAY, dry_run=False, force=False, now=time.time() + LATER
        )
        assert [(e.lane, e.action) for e in entries] == [(None, "kept-dirty")]
        assert "no record of its git dir" in entries[0].detail
        entries = await collect_garbage(
            setup.home, older_than_s=DAY, dry_run=False, force=True, now=time.time() + LATER
        )
        assert [(e.lane, e.action) for e in entries] == [(None, "removed")]
        assert not setup.folder("conv:a").exists()


async def test_nothing_to_collect(tmp_path: Path) -> None:
    with trio.fail_after(5):
        assert await collect_garbage(tmp_path, older_than_s=0, dry_run=False, force=False) == []


async def test_the_gc_command_says_what_it_did(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with trio.fail_after(20):
        setup = await lanes(tmp_path, "conv:a", "conv:b")
        (setup.paths["conv:b"] / "README").write_text("changed\n")
        assert await gc_command(setup.home, 0, dry_run=False, force=False) == 0
        out = capsys.readouterr().out
        assert "removed" in out and "conv:a" in out
        assert "kept-dirty" in out and "conv:b" in out and "--force" in out
        assert "removed the worktrees of 1 conversation(s), kept 1" in out

        assert await gc_command(tmp_path / "empty", DEFAULT_OLDER_THAN_DAYS, False, False) == 0
        assert "no conversation worktrees" in capsys.readouterr().out


async def test_the_gc_command_reports_an_unreadable_home_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with trio.fail_after(5):
        (tmp_path / "worktrees").write_text("not a folder\n")
        assert await gc_command(tmp_path, 14, dry_run=False, force=False) == 1
        err = capsys.readouterr().err
        assert err.startswith("prohost agent gc: error: ") and err.count("\n") == 1


@pytest.mark.parametrize(("raw", "days"), [("14", 14.0), ("0", 0.0), ("0.5", 0.5), (" 7 ", 7.0)])
def test_parse_older_than(raw: str, days: float) -> None:
    assert parse_older_than(raw) == days


@pytest.mark.parametrize("raw", ["", "-1", "nan", "inf", "1e3", "14d", ".", "9" * 30])
def test_parse_older_than_refuses(raw: str) -> None:
    with pytest.raises(ValueError, match=r"^--older-than must be a number of days"):
        parse_older_than(raw)


@pytest.mark.protocol("§4", "§5")
async def test_a_turn_arriving_during_collection_starts_after_it(tmp_path: Path) -> None:
    """The lane is held in the scheduler while its worktrees go (issue 8): a turn
    submitted meanwhile starts only once they are gone, and prepares them afresh."""
    with trio.fail_after(20):
        setup = await lanes(tmp_path, "conv:old")
        folder = setup.folder("conv:old")
        manager = WorktreeManager(setup.home, [setup.source])
        seen: list[tuple[str, bool]] = []
        turned = trio.Event()

        async def turn(key: str, lane: str, slot: Slot) -> None:
            seen.append((key, folder.exists()))
            assert (await manager.prepare(lane)).failures == ()
            turned.set()

        scheduler: Scheduler[str] = Scheduler(2, turn)

        @asynccontextmanager
        async def hold_and_submit(lane: str) -> AsyncIterator[None]:
            async with scheduler.holding(lane):
                scheduler.submit("turn", lane, lane)
                await trio.testing.wait_all_tasks_blocked()
                assert seen == []  # a slot is free, but the lane is held
                yield

        async with trio.open_nursery() as nursery:
            await nursery.start(scheduler.run)
            entries = await collect_garbage(
                setup.home, older_than_s=14 * DAY, dry_run=False, force=False,
                hold=hold_and_submit, now=time.time() + LATER,
            )
            assert by_lane(entries) == {"conv:old": "removed"}
            await turned.wait()
            nursery.cancel_scope.cancel()
        assert seen == [("turn", False)]  # it started after the folder was gone
        assert (setup.paths["conv:old"] / ".git").exists()  # and made it again


@pytest.mark.protocol("§4")
async def test_the_harness_holds_the_lane_while_collecting_its_worktrees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prohost.engine.repos import collect
    from tests.kits.harness import finished, gated_harness

    source = await make_repo(tmp_path / "app")
    remove_folder = collect._Collection._remove_folder
    with trio.fail_after(60):
        async with gated_harness(tmp_path / "h", concurrency=2, repos=(source,)) as (
            gate, running,
        ):
            server, harness = running.server, running.harness
            first = await server.submit_run("turn 1", conversation_id="C1")
            await gate.wait_started(first)
            await gate.release(first)
            await server.wait_until(finished(first))
            await harness.wait_until(lambda h: not h.held)
            folder = harness.worktrees.lane_folder("conv:C1")
            assert folder.exists()
            arrived: list[str] = []

            async def remove_while_a_turn_arrives(*args: object) -> GcEntry:
                # The collection has looked for the last time; a turn comes in now.
                arrived.append(await server.submit_run("turn 2", conversation_id="C1"))
                await server.wait_until(lambda s: s.runs[arrived[0]].state == "accepted")
                await trio.testing.wait_all_tasks_blocked(0.05)
                # A slot is free, but the lane is held: the turn has not begun.
                assert harness.held[arrived[0]].state == "queued"
                return await remove_folder(*args)  # type: ignore[arg-type]

            monkeypatch.setattr(collect._Collection, "_remove_folder", remove_while_a_turn_arrives)
            await upkeep.DailyPass(harness.options.home, harness.bounds, runs=harness.held,
                                   hold=harness.scheduler.holding,
                                   ).collect_worktrees(now=time.time() + LATER)
            assert arrived
            await gate.wait_started(arrived[0])
            await gate.release(arrived[0])
            await server.wait_until(finished(arrived[0]))
            # The turn found its checkout made afresh, after the old one was removed.
            assert (folder / source.name / ".git").exists()


@pytest.mark.parametrize(("idle_s", "said"), [
    (60.0, "idle 1 minute)"), (30.0, "idle 0 minutes)"), (600.0, "idle 10 minutes)"),
    (5400.0, "idle 1.5 hours)"), (3 * 86400.0, "idle 3.0 days)"),
])
def test_the_report_says_how_long_a_conversation_was_idle_in_words(
    idle_s: float, said: str,
) -> None:
    entry = GcEntry(lane_folder=Path("/h/lanes/conv-a"), lane="conv:a", idle_s=idle_s,
                    worktrees=(), action="kept-busy", detail="a run holds it")
    [line, _] = format_entries([entry], older_than_days=14, dry_run=True)
    assert said in line, line
