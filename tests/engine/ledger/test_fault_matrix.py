"""The fault-point matrix (issue 16): every durable step of a run's life × every
fault a disk can throw at it, through the harness's real code.

Modelled on SQLite's own I/O-error tests: one cell per (step, fault), the fault
injected into that step's real ledger write (tests/kits/ledger.py ``FaultyLedger``,
under the group commit), so that each write of a run fails once in some cell.
Everything else is real: the production harness and runner, the reference server
on 127.0.0.1, agent subprocesses (tests/agents/marker.py leaves one line per
execution), the sqlite file. The kill -9 cells are in tests/engine/ledger/test_sqlite_ledger.py
(tests/kits/ledger_crash_child.py): they need a process to kill.

Each cell asserts the invariants: the run is reported exactly once (or, when its
``reported`` step is what failed, stays in the outbox and a restart posts the same
outcome once more, which the server takes as a duplicate); it is never executed
twice; no agent process outlives it. A hung write is never waited out in real
time: the test sees it hang, then moves trio's mock clock on by the production
bound (30 s, :class:`Disk`), the step gives up on it as it would, and the disk
answers.

docs/reliability.md ("Fault-point matrix") has the table of cells.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from prohost.engine.blocking import StepTimedOut
from prohost.engine.ledger import Ledger, RunState
from prohost.server import ServerHandle, faults
from prohost.wire.outcomes import RESTARTED
from tests.kits import harness as harness_kit
from tests.kits.accounts import accounts_used, folders, limit
from tests.kits.fake_clis import FAKE_CLAUDE, claude_env
from tests.kits.faults import Spawns, internal_error, no_process_of_run
from tests.kits.harness import agent_command, finished, pair_home, running_harness, running_server
from tests.kits.ledger import STEP_WRITES, Fault, FaultyLedger
from tests.kits.paths import LEDGER_CRASH_CHILD, ROOT, logs_folder
from tests.kits.process import alive, kill_leftovers, wait_gone

pytestmark = pytest.mark.protocol("§7")

#: Steps of one plain run (the account limit and the tombstone have their own cells).
RUN_STEPS = ["accepted", "started", "process group", "session", "finished", "reported",
             "tombstone"]
FAULTS = ["disk_full", "oserror", "hang"]
#: The production bound on one ledger step (s; prohost.engine.ledger.steps).
LEDGER_STEP_BOUND_S = 30.0
#: §9's promise for the second signal (s): not the harness's own constant, which a
#: breakage could lengthen.
SECOND_SIGNAL_S = 5.0
#: Steps before the spawn: a fault there must leave the agent never spawned.
BEFORE_SPAWN = {"started"}
#: Steps without which the run must not go on (§7): reported as an internal error.
NEVER_SKIPPED = {"started", "process group"}


def executions(marks: Path, run_id: str) -> list[int]:
    """The pids of every execution of ``run_id`` (tests/agents/marker.py's lines)."""
    if not marks.exists():
        return []
    return [int(pid) for rid, pid in (line.split() for line in marks.read_text().splitlines())
            if rid == run_id]


class Disk:
    """Plays the disk for a ``hang`` fault: once the write hangs, the production
    bound on a ledger step (30 s, written here: a breakage could lengthen the
    harness's own constant) passes on trio's mock clock, and once a step has given
    up on it (:class:`StepTimedOut`), the disk answers again."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, clock: trio.testing.MockClock) -> None:
        self.clock = clock
        self.gave_up = trio.Event()
        #: How long the step waited for the hung write (s, trio's clock).
        self.waited_s = math.nan

        async def watched(what: str, step: Callable[[], Awaitable[Any]]) -> Any:
            began = trio.current_time()
            try:
                return await step()
            except StepTimedOut:
                if not self.gave_up.is_set():
                    self.waited_s = trio.current_time() - began
                self.gave_up.set()
                raise

        harness_kit.around_steps(monkeypatch, watched)

    async def hang_then_answer(self, fault: Fault) -> None:
        await trio.to_thread.run_sync(fault.hanging.wait, abandon_on_cancel=True)
        if fault.what != "mark_reported":
            # (`reported` is queued behind the writer, and nobody waits for it.)
            await trio.testing.wait_all_tasks_blocked()
            self.clock.jump(LEDGER_STEP_BOUND_S)
            with trio.fail_after(5):  # a step not bounded at 30 s fails here, soon
                await self.gave_up.wait()
        fault.release.set()


async def settled_row(home: Path, run_id: str) -> Any:
    with Ledger.open(home / "ledger.sqlite3") as ledger:
        return ledger.get(run_id)


@pytest.mark.protocol("§3", "§7")
@pytest.mark.parametrize("kind", FAULTS)
@pytest.mark.parametrize("step", RUN_STEPS)
async def test_one_fault_at_one_step_of_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mock_clock: trio.testing.MockClock,
    step: str, kind: str,
) -> None:
    mock_clock.rate = 1.0  # real time, but for the jump past a hung write's bound
    home = tmp_path / "home"
    marks = logs_folder(tmp_path) / "marks"
    # At the group step the agent holds until killed: one left running when its
    # group could not be written would not end by itself (issue 27.9).
    command = agent_command("marker.py", marks, *(["--hold"] if step == "process group" else []))
    fault = Fault(STEP_WRITES[step], kind)
    disk = Disk(monkeypatch, mock_clock)
    spawns = Spawns(monkeypatch)
    monkeypatch.setattr(harness_kit, "Ledger", FaultyLedger)
    if step == "tombstone":
        # The prune runs at start (and daily): the fault is there from the open.
        monkeypatch.setattr(FaultyLedger, "fault", fault)
    checked = False
    with trio.fail_after(60):
        async with running_server() as server:
            # The disk's nursery is closed before the checks: cancelled, it would
            # cancel their first await too, and absorb that, so that no check
            # after it ever ran (which hid a swallowed `started` error; issue 27.9).
            async with trio.open_nursery() as disks:
                if kind == "hang":
                    disks.start_soon(disk.hang_then_answer, fault)
                async with running_harness(server, home, exec_command=command,
                                           concurrency=1) as running:
                    assert isinstance(running.ledger, FaultyLedger)
                    running.ledger.fault = fault if step != "tombstone" else None
                    run_id = await server.submit_run("work", conversation_id="C1")
                    # A refused delivery (its `accepted` failed) comes back by itself.
                    await server.wait_until(finished(run_id))
                    await running.harness.wait_until(lambda h: run_id not in h.held)
                    # Gone while the harness is still up (its exit kills every group
                    # it started, which would hide one left running).
                    assert await no_process_of_run(run_id)
                    first = server.run(run_id).completion
                    assert first is not None
                    if step != "reported":
                        # Reported is reported: a redelivery (the server retrying a
                        # retryable failure) is answered 204, never run (§3, §7).
                        again = await harness_kit.ack_to(running, server.run(run_id).body_text,
                                                         "again")
                        assert again.status == 204, again
                assert fault.hit.is_set(), f"the {fault.what} write never happened"
                disks.cancel_scope.cancel()
            if kind == "hang" and step != "reported":
                # Given up at the production bound, on trio's clock: no sooner, and
                # not held past it.
                assert LEDGER_STEP_BOUND_S <= disk.waited_s < LEDGER_STEP_BOUND_S + 1.0, \
                    disk.waited_s

            # Spawned once, or never before a durable `started`: counted at the spawn
            # itself, so an agent killed before it could leave its mark counts too.
            # Never executed twice (its marks).
            agents = spawns.of(run_id)
            assert len(agents) == (0 if step in BEFORE_SPAWN else 1), agents
            pids = executions(marks, run_id)
            assert len(pids) <= len(agents), pids
            for agent in agents:
                code = await agent.wait()
                if step == "process group":
                    # It holds until killed: seen killed, not gone by itself.
                    assert code in (-signal.SIGTERM, -signal.SIGKILL), code
                else:
                    assert code == 0, code
            # No agent outlives its run: neither one that left its mark, nor any
            # process carrying the run's id (killed before or after its mark). Judged
            # by the run's id, not the marks' pids: a confined agent's pid is its PID
            # namespace's.
            assert await no_process_of_run(run_id)
            if step in NEVER_SKIPPED:
                # The whole text, which names the step that failed, not a later one
                # that tripped over it (a `started` write's error swallowed: the
                # agent spawned, then `record_pgid` refused a row still `accepted`).
                assert first == {**first, "ok": False, "retryable": True,
                                 "error": internal_error(step, kind)}, first
            else:
                assert first["ok"] is True and first["reply"] == "done", first
            assert server.run(run_id).completion_posts == 1

            row = await settled_row(home, run_id)
            if row.state is not RunState.REPORTED:
                # Only a failed `reported` may leave it unsettled: in the outbox.
                assert step == "reported" and row.state is RunState.FINISHED, row
                async with running_harness(server, home, exec_command=command,
                                           concurrency=1) as restarted:
                    await server.wait_until(
                        lambda s: s.runs[run_id].completion_posts == 2)
                    await restarted.harness.wait_until(lambda h: run_id not in h.held)
                # The same outcome again, which the server takes as a duplicate.
                assert server.run(run_id).completion == first
                assert (await settled_row(home, run_id)).state is RunState.REPORTED
            assert executions(marks, run_id) == pids
            assert len(spawns.of(run_id)) == len(agents)
            checked = True
    assert checked  # every check above ran (none skipped by a cancellation)


async def test_an_outcome_is_posted_only_once_finished_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A disk that stays full when the run ends: `finished` is never skipped (§7).
    # The run waits, tries again, and posts its outcome only once the outbox
    # holds it; posting first left the row `started`, and a restart (or the
    # drain's sweep) then reported the run a second time, as "restarted" (the
    # full-disk soak's bad reports).
    home = tmp_path / "home"
    marks = logs_folder(tmp_path) / "marks"
    fault = Fault("mark_finished", "disk_full", until_released=True)
    monkeypatch.setattr(harness_kit, "Ledger", FaultyLedger)
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
                server, home, exec_command=agent_command("marker.py", marks),
                concurrency=1) as running:
            assert isinstance(running.ledger, FaultyLedger)
            running.ledger.fault = fault
            run_id = await server.submit_run("work", conversation_id="C1")
            await trio.to_thread.run_sync(fault.failed_twice.wait, abandon_on_cancel=True)
            # Tried again, and nothing posted meanwhile.
            assert server.run(run_id).completion_posts == 0
            assert running.harness.held[run_id].state == "reporting"
            fault.release.set()
            await server.wait_until(finished(run_id))
            await running.harness.wait_until(lambda h: run_id not in h.held)
        assert server.run(run_id).completion == {
            **server.run(run_id).completion, "ok": True, "reply": "done"}
        assert server.run(run_id).completion_posts == 1
        assert (await settled_row(home, run_id)).state is RunState.REPORTED
        assert len(executions(marks, run_id)) == 1


@pytest.mark.protocol("§12")
@pytest.mark.parametrize("kind", FAULTS)
async def test_one_fault_at_the_account_limit_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mock_clock: trio.testing.MockClock,
    kind: str,
) -> None:
    """Account ``work`` is at its usage limit: its attempt says so, the limits are
    saved (the fault hits that write), and the run moves to ``personal`` (§12)."""
    mock_clock.rate = 1.0
    accounts = folders(tmp_path, "work", "personal")
    limit(accounts[0][1], time.time() + 3600)
    fault = Fault(STEP_WRITES["account limit"], kind)
    disk = Disk(monkeypatch, mock_clock)
    monkeypatch.setattr(harness_kit, "Ledger", FaultyLedger)
    with trio.fail_after(60):
        async with running_server() as server, trio.open_nursery() as disks:
            if kind == "hang":
                disks.start_soon(disk.hang_then_answer, fault)
            async with running_harness(
                server, tmp_path / "home", exec_command=FAKE_CLAUDE, brain="claude",
                env=claude_env(tmp_path), accounts=accounts, concurrency=1,
            ) as running:
                assert isinstance(running.ledger, FaultyLedger)
                running.ledger.fault = fault
                run_id = await server.submit_run("work", conversation_id="C1")
                await server.wait_until(finished(run_id))
                await running.harness.wait_until(lambda h: run_id not in h.held)
                row = running.ledger.get(run_id)
            disks.cancel_scope.cancel()
    assert fault.hit.is_set()
    record = server.run(run_id)
    # Remembering the limit is not worth the run: it is reported once, done.
    assert record.completion_posts == 1
    assert record.completion is not None and record.completion["ok"] is True
    assert record.completion["account"] == "personal"
    assert accounts_used(tmp_path) == ["work", "personal"]
    assert row is not None and row.state is RunState.REPORTED


# -- kill -9 just before or just after each step ----------------------------------

#: Every (step, when) but two that leave the very same scene as another cell:
#: just before ``finished`` is just after the session's commit (nothing is written
#: between them), and just after the prune at start is a start with nothing to prune.
KILL_CELLS = [(step, when) for step in ["accepted", "started", "process group", "session",
                                        "finished", "reported", "tombstone"]
              for when in ["before", "after"]
              if (step, when) not in {("finished", "before"), ("tombstone", "after")}]
#: Cells whose run has no durable `started` when the harness dies (or, at the prune
#: at start, is submitted after): the restart runs it, once.
RUN_BY_THE_RESTART = {("accepted", "before"), ("accepted", "after"), ("started", "before"),
                      ("tombstone", "before")}
#: Cells whose agent holds until it is killed: the restart must kill it.
HOLD = {("started", "after"), ("process group", "before"), ("process group", "after")}
#: Cells where the restart must find the run interrupted: it had started, and its
#: outcome was not saved (the lane's session, which rides no fsync, is committed
#: on its own just before the ``finished`` commit when no other write is queued).
INTERRUPTED = HOLD | {("session", "before"), ("session", "after")}


def run_processes(run_id: str) -> list[int]:
    """Live processes whose environment carries ``PROHOST_RUN_ID=run_id`` (Linux)."""
    mark = f"PROHOST_RUN_ID={run_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if mark in environ.split(b"\0") and alive(int(entry)):
            found.append(int(entry))
    return found


@asynccontextmanager
async def crash_child(server: ServerHandle, home: Path, command: str, step: str,
                      when: str) -> AsyncIterator[trio.Process]:
    """The production harness on ``home``, killing itself at ``step`` (``when``)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PROHOST_")}
    env["PROHOST_HOME"] = str(home)
    proc = await trio.lowlevel.open_process(
        [sys.executable, str(LEDGER_CRASH_CHILD), "harness", step, when,
         "agent", "run", "--exec", command, "--concurrency", "1", "--machine", "t",
         # Confined, as by default (§13): marker.py writes into the logs folder only.
         "--allow-write", str(logs_folder(home.parent))],
        env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield proc
    finally:
        with trio.CancelScope(shield=True):
            if proc.returncode is None:
                proc.kill()
            await proc.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize(("step", "when"), KILL_CELLS)
async def test_a_kill_just_before_or_after_one_step_of_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str, when: str
) -> None:
    # Where the restart must kill the agent, the agent is silent: one that writes
    # to its dead harness's pipes dies of EPIPE, and would hide who killed it.
    await kill_cell(tmp_path, monkeypatch, step, when,
                    stubborn=(step, when) == ("process group", "after"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
async def test_a_kill_between_the_spawn_and_its_group_leaves_no_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await kill_cell(tmp_path, monkeypatch, "process group", "before", stubborn=True,
                    gone_within_s=2.0)


async def kill_cell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str, when: str, *,
                    stubborn: bool = False, gone_within_s: float = 10.0) -> None:
    """One kill cell; with ``stubborn``, an agent that holds whatever its prompt.
    ``gone_within_s`` only bounds a failure (an agent nobody killed)."""
    home = tmp_path / "home"
    marks = logs_folder(tmp_path) / "marks"
    command = agent_command("marker.py", marks, *(["--hold"] if stubborn else []))
    cell = (step, when)
    spawns = Spawns(monkeypatch)  # the restart's (the killed harness is a child)
    run_id = None
    try:
        with trio.fail_after(60):
            async with running_server() as server:
                pair_home(server, home)
                connects = server.state.total_connects
                async with crash_child(server, home, command, step, when) as child:
                    if step != "tombstone":
                        await server.wait_until(
                            lambda s: s.total_connects > connects and s.connected > 0)
                        run_id = await server.submit_run(
                            "hold" if cell in HOLD else "work", conversation_id="C1")
                    assert await child.wait() == -signal.SIGKILL
                await server.wait_until(lambda s: s.connected == 0)
                if run_id is None:  # killed at the prune at start: the next run runs
                    run_id = await server.submit_run("work", conversation_id="C1")
                async with running_harness(server, home, exec_command=command,
                                           concurrency=1) as restarted:
                    # The server sends the run again now (it would after its own
                    # redelivery delay): whatever the ledger has, it never runs twice.
                    faults.redeliver(server.state, run_id)
                    await server.wait_until(finished(run_id))
                    await restarted.harness.wait_until(lambda h: run_id not in h.held)
                    assert restarted.ledger is not None
                    row = restarted.ledger.get(run_id)
                    assert row is not None and row.state is RunState.REPORTED
                record = server.run(run_id)
                completion = record.completion
                assert completion is not None
                if cell in INTERRUPTED:
                    assert completion["error"] == RESTARTED, completion
                else:
                    assert completion["ok"] is True and completion["reply"] == "done"
                # Reported once; only a kill between the POST and its `reported`
                # posts the saved outcome again, which the server takes as a duplicate.
                assert record.completion_posts == (2 if cell == ("reported", "before") else 1)
                # The restart runs only a run that never started: counted at the spawn.
                assert len(spawns.of(run_id)) == (1 if cell in RUN_BY_THE_RESTART else 0)
                pids = executions(marks, run_id)
                if step == "started" and when == "after":
                    assert pids == []  # `started`, then killed before the spawn
                else:
                    assert len(pids) <= 1 if cell in INTERRUPTED else len(pids) == 1, pids
                # No agent outlives the run (the restart killed the held ones).
                for pid in run_processes(run_id):
                    assert await wait_gone(pid, gone_within_s), \
                        f"agent {pid} of {cell} outlived its run"
    finally:
        if run_id is not None:
            kill_leftovers(run_processes(run_id))


# -- a hung write and the second signal's window ---------------------------------


@pytest.mark.protocol("§9")
@pytest.mark.parametrize("step", ["started", "process group", "finished"])
async def test_the_second_signal_exits_in_its_window_while_a_write_hangs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mock_clock: trio.testing.MockClock,
    step: str,
) -> None:
    """The window is passed in virtual time (the clock runs, and jumps 5 s), and
    measured on the harness's exit, the event the test waits for."""
    mock_clock.rate = 1.0
    home = tmp_path / "home"
    marks = logs_folder(tmp_path) / "marks"
    command = agent_command("marker.py", marks)
    fault = Fault(STEP_WRITES[step], "hang")
    spawns = Spawns(monkeypatch)
    monkeypatch.setattr(harness_kit, "Ledger", FaultyLedger)
    try:
        with trio.fail_after(60):
            async with running_server() as server:
                async with running_harness(server, home, exec_command=command,
                                           concurrency=1) as running:
                    assert isinstance(running.ledger, FaultyLedger)
                    running.ledger.fault = fault
                    run_id = await server.submit_run("work", conversation_id="C1")
                    await trio.to_thread.run_sync(fault.hanging.wait, abandon_on_cancel=True)
                    await trio.testing.wait_all_tasks_blocked()
                    stopped_at = trio.current_time()
                    running.harness.stop()
                    mock_clock.jump(SECOND_SIGNAL_S)
                    # The disk still hangs, and the harness has exited all the same,
                    # within §9's 5 s (of virtual time: the jump, and the real time
                    # the exit itself took).
                    assert await running.wait_exit() == 130
                    took = trio.current_time() - stopped_at
                    assert SECOND_SIGNAL_S <= took < SECOND_SIGNAL_S + 1.0, took
                    assert not fault.release.is_set()
                    fault.release.set()
                # The hung write went through once the disk answered; a restart
                # reports the run once, and never runs it again.
                before = executions(marks, run_id)
                async with running_harness(server, home, exec_command=command,
                                           concurrency=1) as restarted:
                    await server.wait_until(finished(run_id))
                    await restarted.harness.wait_until(lambda h: run_id not in h.held)
                assert server.run(run_id).completion_posts == 1
                assert executions(marks, run_id) == before
                # Spawned once, or never while `started` hangs; none by the restart.
                # (Stopped at once, the agent may not have left its mark yet.)
                assert len(spawns.of(run_id)) == (0 if step == "started" else 1)
                assert len(before) <= len(spawns.of(run_id))
                assert await no_process_of_run(run_id)
    finally:
        fault.release.set()
