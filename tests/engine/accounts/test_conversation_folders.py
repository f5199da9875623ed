"""A conversation's own agent folders go with it (issue 36, point 5): its Claude
Code and Codex folders of every account (``$PROHOST_HOME/cli/<account>/lanes/<lane
folder>``) and its ACP agents' (``$PROHOST_HOME/agents/<agent>/<lane folder>``)
are removed when ``agent gc`` or the harness's daily pass collects its worktrees,
and never another conversation's; overlay work folders a crashed harness left are
swept. Real worktrees, real folders, the real collection."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
import trio.testing

from prohost.commands.gc import gc_command
from prohost.engine.accounts.book import DEFAULT_ACCOUNT
from prohost.engine.blocking import Bounds
from prohost.engine.ledger import Ledger
from prohost.engine.ledger.steps import LedgerSteps
from prohost.engine.repos.lanemarker import LANE_MARKER, touch_marker
from prohost.engine.repos.worktrees import lane_folder_name
from prohost.engine.run.heldrun import HeldRun
from prohost.engine.supervisor import upkeep
from tests.kits.repos import isolate_git, lanes


@pytest.fixture(autouse=True)
def isolated_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No git configuration of the machine reaches these repositories."""
    isolate_git(tmp_path, monkeypatch)


DAY = 86400.0


def leave_state(home: Path, lane: str) -> list[Path]:
    """What a conversation's runs leave in its own agent folders: transcripts, a
    planted setting, a folder a hostile run made unreadable. Its top folders."""
    name = lane_folder_name(lane)
    claude = home / "cli" / "default" / "lanes" / name / "claude"
    codex = home / "cli" / "work" / "lanes" / name / "codex"
    opencode = home / "agents" / "opencode" / name
    (claude / "projects" / "p").mkdir(parents=True)
    (claude / "projects" / "p" / "s.jsonl").write_text(f"transcript of {lane}\n")
    (claude / "settings.json").write_text("{}\n")
    (codex / "sessions" / "2026").mkdir(parents=True)
    (codex / "sessions" / "2026" / "rollout.jsonl").write_text(f"{lane}\n")
    (opencode / ".config" / "opencode").mkdir(parents=True)
    (opencode / ".config" / "opencode" / "run.txt").write_text(f"{lane}\n")
    locked = claude / "locked"
    (locked / "inner").mkdir(parents=True)
    (locked / "inner" / "f").write_text("x\n")
    (locked / "inner").chmod(0)
    locked.chmod(0)
    return [claude.parent, codex.parent, opencode]


def stale_overlay_work(home: Path) -> Path:
    """An overlay's work folders as a killed harness leaves them (overlayfs's own
    ``work`` at mode 0)."""
    folder = home / "agents" / ".overlay-work" / "0123456789abcdef"
    (folder / "0" / "work" / "work").mkdir(parents=True)
    (folder / "0" / "work").chmod(0)
    return folder


@contextlib.asynccontextmanager
async def holding(lane: str) -> AsyncIterator[None]:
    yield


async def test_the_daily_pass_removes_a_collected_conversation_s_agent_folders_alone(
    tmp_path: Path,
) -> None:
    with trio.fail_after(20):
        setup = await lanes(tmp_path, "conv:old", "conv:recent")
        now = time.time() + 30 * DAY
        marker = setup.folder("conv:recent") / LANE_MARKER
        marker.write_text(json.dumps({**json.loads(marker.read_text()),
                                      "last_used": now - DAY}))
        old = leave_state(setup.home, "conv:old")
        recent = leave_state(setup.home, "conv:recent")
        await upkeep.DailyPass(setup.home, Bounds(), hold=holding).collect_worktrees(now=now)
    assert not setup.folder("conv:old").exists()
    assert [lexists(folder) for folder in old] == [False, False, False]
    assert all(folder.is_dir() for folder in recent)
    kept = recent[0] / "claude" / "projects" / "p" / "s.jsonl"
    assert kept.read_text() == "transcript of conv:recent\n"


async def test_agent_gc_removes_them_and_sweeps_stale_overlay_work_folders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    with trio.fail_after(20):
        setup = await lanes(tmp_path, "conv:a")
        gone = leave_state(setup.home, "conv:a")
        work = stale_overlay_work(setup.home)
        assert await gc_command(setup.home, 0, dry_run=False, force=False) == 0
    assert "removed" in capsys.readouterr().out
    assert [lexists(folder) for folder in gone] == [False, False, False]
    assert not lexists(work)


def lexists(path: Path) -> bool:
    """Whether anything, a link included, is at ``path``."""
    return os.path.lexists(path)


async def test_without_worktrees_an_idle_conversation_s_folders_go_by_the_daily_pass(
    tmp_path: Path, mock_clock: trio.testing.MockClock,
) -> None:
    """Without ``--repos`` there is no lane folder to collect a conversation's agent
    folders with: the daily pass collects them by themselves once the ledger (a
    real sqlite one) has had no run of the conversation for the period, by when its
    folders were last written where the ledger no longer knows it; never while a
    run of it is held, nor one that has worktrees (they go with those)."""
    # Jumps only once nothing has happened for a while: the pass's file and
    # ledger steps run in threads, and must not see the clock jump under them.
    mock_clock.autojump_threshold = 1.0
    home = tmp_path / "home"
    home.mkdir()
    start = time.time()
    ledger = Ledger.open(home / "ledger.sqlite3")
    # Last used, days before the test's start: idle past the period (14 days) at
    # the first daily pass (day 1), or for conv:closer at the second (day 2).
    ages = {"conv:old": 20, "conv:closer": 12.5, "conv:held": 20, "conv:worktrees": 20}
    for index, (lane, days) in enumerate(ages.items()):
        ledger.admit(f"run-{index}", lane, "{}", now=start - days * DAY)
        ledger.save_turn(lane, DEFAULT_ACCOUNT, f"session-{index}", now=start - days * DAY)
    left = {lane: leave_state(home, lane) for lane in [*ages, "conv:forgotten"]}
    # The ledger no longer knows this one; its folders were last written 20 days ago.
    for folder in left["conv:forgotten"]:
        for path in [folder, *folder.iterdir()]:
            os.utime(path, (start - 20 * DAY, start - 20 * DAY), follow_symlinks=False)
    # Its worktrees folder has the name a person reads; its marker says whose it is.
    kept = home / "worktrees" / "worktrees"
    kept.mkdir(parents=True)
    touch_marker(kept, "conv:worktrees", start)
    runs = {"run-2": HeldRun("run-2", "conv:held")}
    held: list[tuple[str, bool]] = []

    @contextlib.asynccontextmanager
    async def hold(lane: str) -> AsyncIterator[None]:
        yield
        held.append((lane, any(lexists(folder) for folder in left[lane])))

    def there() -> set[str]:
        return {lane for lane, folders in left.items() if any(map(lexists, folders))}

    try:
        with trio.fail_after(4 * DAY):
            async with trio.open_nursery() as nursery:
                daily = upkeep.DailyPass(home, Bounds(), LedgerSteps(ledger), runs, hold,
                                         clock=lambda: start + trio.current_time())
                # Started as the harness starts them (Chores.start), without --repos.
                for chore in daily.every_day(worktrees=False):
                    nursery.start_soon(chore)
                await trio.sleep(DAY + 1)
                after_one = there()
                await trio.sleep(DAY)
                after_two = there()
                nursery.cancel_scope.cancel()
    finally:
        ledger.close()
    assert after_one == {"conv:closer", "conv:held", "conv:worktrees"}
    assert after_two == {"conv:held", "conv:worktrees"}
    # Each removal with its lane held, none of them held in vain.
    assert held == [("conv:old", False), ("conv:closer", False)]
