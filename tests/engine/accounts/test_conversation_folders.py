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

from prohost.commands.gc import gc_command
from prohost.engine.repos.lanemarker import LANE_MARKER
from prohost.engine.repos.worktrees import lane_folder_name
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
        await upkeep.collect_worktrees(setup.home, {}, holding, now=now)
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
