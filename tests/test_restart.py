"""§7 crash recovery: the harness process is killed with SIGKILL, then started again.

Every harness here is a real ``python -m prohost agent run`` subprocess on a home
paired with the in-process reference server; its ledger is the real sqlite file
in that home. The agents are the test's gated fakes (tests/kit.py ``Gate``).
Nothing sleeps: the tests wait on server state, the Gate, the harness's log and
process exits.

The helpers at the top are shared with tests/test_signals.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from prohost.harness import RESTARTED
from prohost.ledger import Ledger, LedgerRow, RunState
from prohost.server import ServerHandle
from tests.kit import (
    Gate,
    acks,
    agent_command,
    delivery_frame,
    finished,
    pair_home,
    running_server,
    wait_for_ack,
)

# ---------------------------------------------------------------------- shared helpers


class HarnessProcess:
    """One ``python -m prohost agent run`` subprocess, and its log lines (its stderr)."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.log: list[str] = []
        self._changed = trio.Event()

    async def read_log(self) -> None:
        assert self.proc.stderr is not None
        pending = b""
        while chunk := await self.proc.stderr.receive_some():
            *lines, pending = (pending + chunk).split(b"\n")
            self.log.extend(line.decode("utf-8", "replace") for line in lines)
            self._changed.set()
            self._changed = trio.Event()
        if pending:
            self.log.append(pending.decode("utf-8", "replace"))

    async def wait_log(self, text: str) -> None:
        """Return once a log line containing ``text`` has been written."""
        while not any(text in line for line in self.log):
            await self._changed.wait()

    def send_signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    async def kill(self) -> None:
        """SIGKILL: the harness gets no chance to do anything (§7's ``kill -9``)."""
        self.proc.send_signal(signal.SIGKILL)
        assert await self.proc.wait() == -signal.SIGKILL


@asynccontextmanager
async def harness_process(
    server: ServerHandle, home: Path, command: str, *, concurrency: int = 1
) -> AsyncIterator[HarnessProcess]:
    """Start a harness on ``home`` (already paired) and wait until it is connected.

    On the way out a harness still running is killed, and its log is printed (pytest
    shows it when the test fails).
    """
    env = {key: value for key, value in os.environ.items() if not key.startswith("PROHOST_")}
    env["PROHOST_HOME"] = str(home)
    connects = server.state.total_connects
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "prohost", "agent", "run", "--exec", command,
         "--concurrency", str(concurrency), "--machine", "t"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    harness = HarnessProcess(proc)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(harness.read_log)

            async def watch_exit() -> None:
                await proc.wait()
                server.state.changed()  # so that the wait below sees it

            nursery.start_soon(watch_exit)
            try:
                await server.wait_until(lambda s: proc.returncode is not None
                                        or (s.total_connects > connects and s.connected > 0))
                assert proc.returncode is None, f"the harness exited with {proc.returncode}"
                yield harness
            finally:
                with trio.CancelScope(shield=True):
                    if proc.returncode is None:
                        proc.kill()
                    await proc.wait()
                    nursery.cancel_scope.cancel()
    finally:
        print(f"--- log of harness pid {proc.pid} (exit {proc.returncode}) ---",
              *harness.log, sep="\n")


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, waiting to be reaped, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


async def wait_gone(pid: int, within_s: float = 10.0) -> bool:
    """Wait (on a pidfd, no polling) until ``pid`` has exited; False if it has not
    within ``within_s`` (generous: only a process nobody killed takes that long)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        with trio.move_on_after(within_s):
            await trio.lowlevel.wait_readable(fd)
    finally:
        os.close(fd)
    return not alive(pid)


def kill_leftovers(pids: Iterable[int]) -> None:
    """Test cleanup: SIGKILL every given agent process and its group."""
    ours = os.getpgrp()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            group = os.getpgid(pid)
            if group != ours:
                os.killpg(group, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


async def until(server: ServerHandle, gate: Gate, predicate: Callable[[], bool]) -> None:
    """Return once ``predicate()`` holds, re-checking whenever the server or the gate
    changes (for conditions that mix both, such as "reported, or started twice")."""
    async with trio.open_nursery() as nursery:

        async def on_server() -> None:
            await server.wait_until(lambda _: predicate())
            nursery.cancel_scope.cancel()

        async def on_gate() -> None:
            await gate.wait(lambda _: predicate())
            nursery.cancel_scope.cancel()

        nursery.start_soon(on_server)
        nursery.start_soon(on_gate)


def ledger_row(home: Path, run_id: str) -> LedgerRow:
    with Ledger.open(home / "ledger.sqlite3") as ledger:
        row = ledger.get(run_id)
    assert row is not None, f"run {run_id} is not in the ledger"
    return row


async def redeliver(
    server: ServerHandle, harness: HarnessProcess, run_id: str, delivery_id: str
) -> int:
    """Send the run's delivery again, as the server would, and return the ack's status."""
    secret = next(iter(server.state.harnesses.values())).secret
    await server.send_raw(delivery_frame(secret, server.run(run_id).body_text,
                                         delivery_id=delivery_id))
    await server.wait_until(lambda s: harness.proc.returncode is not None
                            or any(ack.id == delivery_id for ack in acks(s)))
    assert harness.proc.returncode is None, f"the harness exited with {harness.proc.returncode}"
    return (await wait_for_ack(server, delivery_id)).status


# ---------------------------------------------------------------------- the tests


async def test_after_a_kill_the_interrupted_run_is_reported_and_killed_and_queued_runs_resume(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    gate = Gate()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(gate.serve)
            command = agent_command("hardy.py", gate.port)
            try:
                async with running_server() as server:
                    pair_home(server, home)
                    async with harness_process(server, home, command) as first:
                        busy = await server.submit_run("long job", conversation_id="A")
                        await gate.wait_started(busy)
                        # One slot, and it is taken: these are accepted but never start.
                        waiting = [await server.submit_run(f"waiting {n}", conversation_id=lane)
                                   for n, lane in enumerate(("B", "C"))]
                        await server.wait_until(
                            lambda s: all(s.runs[r].state == "accepted" for r in waiting))
                        await first.kill()
                    await server.wait_until(lambda s: s.connected == 0)

                    # The scene the restarted harness finds: an agent left running (it
                    # outlives its harness), its group in the ledger, two runs never started.
                    agent_pid = gate.pids[busy]
                    assert alive(agent_pid)
                    row = ledger_row(home, busy)
                    assert row.state is RunState.STARTED
                    assert row.pgid == os.getpgid(agent_pid)
                    assert [ledger_row(home, r).state for r in waiting] == [RunState.ACCEPTED] * 2
                    assert gate.started == [busy]

                    async with harness_process(server, home, command) as second:
                        assert await wait_gone(agent_pid), "the leftover agent is still alive"
                        # The accepted runs run now, in the order accepted; `busy` never
                        # runs again.
                        for count, run_id in enumerate(waiting, start=2):
                            await gate.wait(lambda g, count=count: len(g.started) == count)
                            assert gate.started[-1] == run_id
                            await gate.release(run_id, f"answer to {run_id}")
                        await server.wait_until(finished(busy))
                        assert server.run(busy).completion == {
                            "run_id": busy, "ok": False, "error": RESTARTED, "retryable": True}
                        await server.wait_until(finished(*waiting))
                        assert [server.run(r).reply for r in waiting] == [
                            f"answer to {r}" for r in waiting]
                        assert gate.started == [busy, *waiting]  # busy never ran again

                        second.send_signal(signal.SIGTERM)  # nothing left: drains at once
                        assert await second.proc.wait() == 0
                    assert {ledger_row(home, r).state for r in [busy, *waiting]} == {
                        RunState.REPORTED}
                    assert server.run(busy).completion_posts == 1
            finally:
                kill_leftovers(gate.pids.values())
                nursery.cancel_scope.cancel()


async def test_after_a_kill_a_finished_unreported_run_posts_its_saved_outcome(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    gate = Gate()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(gate.serve)
            try:
                async with running_server() as server:
                    pair_home(server, home)
                    # The server is down for completions: the report keeps being retried.
                    server.state.completion_faults.extend([(503, {})] * 100)
                    async with harness_process(server, home, gate.command) as first:
                        run_id = await server.submit_run("work")
                        await gate.wait_started(run_id)
                        await gate.release(run_id, "the saved answer")
                        # A completion POST is made only after the outcome is in the ledger.
                        await server.wait_until(lambda s: s.runs[run_id].completion_posts >= 1)
                        await first.kill()
                    await server.wait_until(lambda s: s.connected == 0)

                    row = ledger_row(home, run_id)
                    assert row.state is RunState.FINISHED
                    assert row.outcome is not None and "the saved answer" in row.outcome
                    assert server.run(run_id).completion is None
                    posts_before = server.run(run_id).completion_posts
                    server.state.completion_faults.clear()

                    async with harness_process(server, home, gate.command) as second:
                        await until(server, gate, lambda: finished(run_id)(server.state)
                                    or len(gate.started) > 1)
                        assert gate.started == [run_id]  # the agent ran once, before the kill
                        completion = server.run(run_id).completion
                        assert completion is not None
                        assert completion["ok"] is True
                        assert completion["reply"] == "the saved answer"
                        assert server.run(run_id).completion_posts == posts_before + 1
                        second.send_signal(signal.SIGTERM)
                        assert await second.proc.wait() == 0
                    assert gate.started == [run_id]
                    assert ledger_row(home, run_id).state is RunState.REPORTED
            finally:
                kill_leftovers(gate.pids.values())
                nursery.cancel_scope.cancel()


async def test_after_a_kill_redeliveries_are_never_executed_twice(tmp_path: Path) -> None:
    home = tmp_path / "home"
    gate = Gate()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(gate.serve)
            command = agent_command("hardy.py", gate.port)
            try:
                async with running_server() as server:
                    pair_home(server, home)
                    async with harness_process(server, home, command) as first:
                        done = await server.submit_run("quick", conversation_id="D")
                        await gate.wait_started(done)
                        await gate.release(done, "quick answer")
                        await server.wait_until(finished(done))
                        interrupted = await server.submit_run("long", conversation_id="A")
                        # One slot: it frees only once `done` is reported in the ledger.
                        await gate.wait_started(interrupted)
                        pending = await server.submit_run("later", conversation_id="B")
                        await server.wait_until(lambda s: s.runs[pending].state == "accepted")
                        await first.kill()
                    await server.wait_until(lambda s: s.connected == 0)
                    assert ledger_row(home, done).state is RunState.REPORTED

                    # Keep the interrupted run's restart report unsettled for now (Retry-After
                    # keeps the retries from hammering), so it stays `finished` in the ledger.
                    server.state.completion_faults.extend([(503, {"Retry-After": "1"})] * 100)
                    async with harness_process(server, home, command) as second:
                        await server.wait_until(lambda s: s.runs[interrupted].completion_posts > 0)
                        await gate.wait_started(pending)

                        assert await redeliver(server, second, interrupted, "dlv_again_1") == 200
                        assert await redeliver(server, second, pending, "dlv_again_2") == 200
                        assert await redeliver(server, second, done, "dlv_again_3") == 204

                        server.state.completion_faults.clear()
                        await server.wait_until(finished(interrupted))
                        completion = server.run(interrupted).completion
                        assert completion is not None and completion["error"] == RESTARTED
                        await gate.release(pending, "later answer")
                        await server.wait_until(finished(pending))
                        # One slot again: this starts only once `pending` is reported.
                        last = await server.submit_run("last", conversation_id="E")
                        await gate.wait(lambda g: len(g.started) == 4)
                        assert gate.started == [done, interrupted, pending, last]
                        assert await redeliver(server, second, pending, "dlv_again_4") == 204
                        await gate.release(last)
                        await server.wait_until(finished(last))
                        second.send_signal(signal.SIGTERM)
                        assert await second.proc.wait() == 0

                    assert gate.started == [done, interrupted, pending, last]
                    assert server.run(pending).reply == "later answer"
                    assert server.run(done).completion_posts == 1
                    for run_id in (done, interrupted, pending):
                        # The server's own delivery was acked once, by the first harness.
                        assert server.run(run_id).ack_statuses == [200]
            finally:
                kill_leftovers(gate.pids.values())
                nursery.cancel_scope.cancel()
