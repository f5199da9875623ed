"""`prohost agent gc` beside a running harness (issue 20, point 5): the worktree an
agent is working in stays, the idle ones still go, and when the harness's status
cannot be trusted nothing is removed and the command says what to do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from prohost import __version__
from prohost.commands import gc
from prohost.commands.gc import gc_command
from prohost.engine.repos.lanemarker import LANE_MARKER
from prohost.engine.view.snapshot import (
    STATUS_FILE,
    RunRow,
    Snapshot,
    write_snapshot,
)
from prohost.home import InstanceLock, LockHeld, lock_held_message
from prohost.invocation import command
from tests.kits.harness import finished, gated_harness
from tests.kits.lockholder import signalled, start_holder, stop_holder
from tests.kits.paths import ROOT
from tests.kits.program import cli_env
from tests.kits.repos import lanes, make_repo, worktree_paths
from tests.kits.serverproc import quoted_commands, run_printed, without_prohost_on_path
from tests.kits.status import status_says

HOUR = 3600.0


#: No git configuration of the machine reaches this module's repositories.
pytestmark = pytest.mark.usefixtures("isolated_git")


async def run_gc(home: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """``python -m prohost agent gc --older-than 0`` on ``home``, as a person types it."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PROHOST_")}
    env["PROHOST_HOME"] = str(home)
    return await trio.run_process(
        [sys.executable, "-m", "prohost", "agent", "gc", "--older-than", "0", *args],
        env=env, cwd=ROOT, stdin=subprocess.DEVNULL, capture_stdout=True,
        capture_stderr=True, check=False,
    )


def set_last_used(folder: Path, when: float) -> None:
    marker = folder / LANE_MARKER
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "last_used": when}))


async def exited_pid() -> int:
    """The pid of a process that has come and gone."""
    proc = await trio.lowlevel.open_process(["true"])
    await proc.wait()
    return proc.pid


def status(pid: int, taken_at: float, *lanes: str) -> Snapshot:
    return Snapshot(
        taken_at=taken_at, pid=pid, version=__version__, connection="connected",
        server="ws://127.0.0.1:1/ws", machine="test", brain="plain", slots=1,
        slots_used=len(lanes), queued=0,
        runs=tuple(RunRow(run_id=f"r{i}", lane=lane, conversation=None, state="running")
                   for i, lane in enumerate(lanes)),
    )


async def test_gc_keeps_the_worktree_an_agent_is_working_in(tmp_path: Path) -> None:
    """A real harness with --repos, its agent held running in C1's worktree: gc run
    beside it keeps that worktree and says why, and still removes idle C2's."""
    source = await make_repo(tmp_path / "app")
    home = tmp_path / "h"
    with trio.fail_after(60):
        async with gated_harness(home, repos=(source,)) as (gate, running):
            server, harness = running.server, running.harness
            # `agent run` holds the home's lock around the harness (commands/agent.py).
            with InstanceLock.acquire(home):
                idle = await server.submit_run("earlier turn", conversation_id="C2")
                await gate.wait_started(idle)
                await gate.release(idle)
                await server.wait_until(finished(idle))
                set_last_used(harness.worktrees.lane_folder("conv:C2"), time.time() - HOUR)

                busy = await server.submit_run("long job", conversation_id="C1")
                await gate.wait_started(busy)
                await status_says(home, lambda seen: any(row.lane == "conv:C1"
                                                         for row in seen.runs))
                c1 = harness.worktrees.lane_folder("conv:C1")
                # Old enough to collect, if that were the only question.
                set_last_used(c1, time.time() - HOUR)

                result = await run_gc(home)
                out = result.stdout.decode()
                assert result.returncode == 0, result.stderr.decode()
                assert f"a prohost agent (pid {os.getpid()}) is running on this home" in out
                kept = next(line for line in out.splitlines() if "conv:C1" in line)
                assert "kept-busy" in kept and "queued or running" in kept
                gone = next(line for line in out.splitlines() if "conv:C2" in line)
                assert "removed" in gone
                assert (c1 / source.name / ".git").exists()
                assert not harness.worktrees.lane_folder("conv:C2").exists()
                assert gate.running == 1  # the agent never noticed

                await gate.release(busy)
                await server.wait_until(finished(busy))
                assert server.state.runs[busy].state == "completed"


@pytest.mark.parametrize("problem", ["stale", "missing", "exited", "other writer"])
async def test_gc_refuses_when_the_running_harness_status_cannot_be_trusted(
    tmp_path: Path, problem: str
) -> None:
    with trio.fail_after(30):
        setup = await lanes(tmp_path, "conv:a")
        before = await worktree_paths(setup.source, setup.home)
        now = time.time()
        snapshot = {
            "stale": status(os.getpid(), now - HOUR),
            "missing": None,
            "exited": status(await exited_pid(), now),
            "other writer": status(os.getppid(), now),
        }[problem]
        if snapshot is not None:
            write_snapshot(setup.home, snapshot)
        with InstanceLock.acquire(setup.home):
            result = await run_gc(setup.home)
        err = result.stderr.decode()
        assert result.returncode == 1
        assert result.stdout == b""
        assert err.count("\n") == 1 and err.startswith("prohost agent gc: error: ")
        assert f"pid {os.getpid()} holds" in err
        assert "removes none" in err and "kill" not in err
        assert f"or stop it first (`{command('agent', 'stop')}`)" in err
        reason = {
            "stale": "was last written 1 hour ago (is it hung?)",
            "missing": f"it has written no status file ({setup.home / STATUS_FILE})",
            "exited": "which has exited",
            "other writer": "not by the lock's holder",
        }[problem]
        assert reason in err
        assert setup.folder("conv:a").exists()
        assert await worktree_paths(setup.source, setup.home) == before


async def test_a_lane_used_since_the_status_was_written_is_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The status is rewritten every few seconds; a turn that began since it was
    written may not be listed yet, so its lane is kept too."""
    with trio.fail_after(30):
        setup = await lanes(tmp_path, "conv:new", "conv:old")
        now = time.time()
        set_last_used(setup.folder("conv:new"), now)
        set_last_used(setup.folder("conv:old"), now - HOUR)
        write_snapshot(setup.home, status(os.getpid(), now - 10))
        with InstanceLock.acquire(setup.home):
            assert await gc_command(setup.home, 0, dry_run=False, force=False) == 0
        out = capsys.readouterr().out
        assert "kept-busy" in next(line for line in out.splitlines() if "conv:new" in line)
        assert "removed" in next(line for line in out.splitlines() if "conv:old" in line)
        assert setup.folder("conv:new").exists()
        assert not setup.folder("conv:old").exists()


async def test_without_a_harness_gc_collects_holding_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No harness: collected as before, and a harness started meanwhile is refused the
    home (it would otherwise use a worktree being removed); the lock is let go after."""
    with trio.fail_after(30):
        setup = await lanes(tmp_path, "conv:a")
        real_collect = gc.collect_garbage
        refused: list[int | None] = []

        async def collect_while_a_harness_starts(*args: object, **kwargs: object) -> object:
            with pytest.raises(LockHeld) as caught:
                InstanceLock.acquire(setup.home)
            refused.append(caught.value.pid)
            # What `agent run` prints then names it: the lock says it is a gc.
            assert f"`{command('agent', 'gc')}` (pid {os.getpid()}) is removing worktrees" in \
                lock_held_message(caught.value, setup.home)
            return await real_collect(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(gc, "collect_garbage", collect_while_a_harness_starts)
        assert await gc_command(setup.home, 0, dry_run=False, force=False) == 0
        assert refused == [os.getpid()]
        assert not setup.folder("conv:a").exists()
        InstanceLock.acquire(setup.home).release()

        result = await run_gc(tmp_path / "never made")
        assert result.returncode == 0 and b"no conversation worktrees" in result.stdout
        assert not (tmp_path / "never made").exists()


async def test_the_advice_to_stop_an_agent_whose_status_is_unknown_runs_as_printed(
    tmp_path: Path
) -> None:
    # An agent holds the home but wrote no status: gc removes nothing and says how
    # to stop it, with a command that runs as printed without prohost on PATH
    # (not `kill PID`: `agent stop` lets its runs finish).
    with trio.fail_after(30):
        setup = await lanes(tmp_path, "conv:a")
        holder = start_holder(setup.home, "harness")
        try:
            refused = await run_gc(setup.home)
            err = refused.stderr.decode()
            assert refused.returncode == 1 and "removes none" in err, err
            stop = quoted_commands(err.split("or stop it first", 1)[1])[0]
            env = without_prohost_on_path(cli_env(setup.home))
            stopped = await run_printed(stop, env)
            assert stopped.returncode == 0, stopped.stderr
            assert signalled(holder)
        finally:
            stop_holder(holder)
        assert setup.folder("conv:a").exists()


async def test_a_gc_beside_another_gc_says_to_wait_for_it(tmp_path: Path) -> None:
    # The holder is another collection: it ends by itself, so the advice is to run
    # this one again once it is done, not to stop (or kill) it.
    with trio.fail_after(30):
        setup = await lanes(tmp_path, "conv:a")
        holder = start_holder(setup.home, "gc")
        try:
            refused = await run_gc(setup.home)
        finally:
            stop_holder(holder)
        err = refused.stderr.decode()
        assert refused.returncode == 1
        assert err.startswith("prohost agent gc: error: ") and err.count("\n") == 1
        assert f"`{command('agent', 'gc')}` (pid {holder.pid}) is removing worktrees" in err
        assert f"run `{command('agent', 'gc')}` again once it is done" in err
        assert "kill" not in err and "agent stop" not in err
        assert setup.folder("conv:a").exists()
