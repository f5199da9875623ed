"""§9 shutdown: the first, second and third SIGINT/SIGTERM sent to a real harness process.

The harness is a ``python -m prohost agent run`` subprocess (see tests/kits/process.py
for the helpers); agents are the test's gated fakes. Nothing sleeps: the tests wait
on server state, the Gate, the harness's log and process exits, and never assert how
fast anything was.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
import trio

from prohost.engine.ledger import RunState
from prohost.server import ServerHandle
from prohost.wire.outcomes import NOT_STARTED, STOPPED
from prohost.wire.protocol import Heartbeat, Pong, Status
from tests.kits.harness import agent_command, busy_and_queued, finished, host_pid, start_run
from tests.kits.paths import SCRIPTS, logs_folder
from tests.kits.process import (
    HarnessProcess,
    alive,
    gated_process,
    harness_process,
    ledger_row,
    paired_with_gate,
    wait_gone,
)
from tests.kits.signal_edges import EARLY_LINE, EXIT_PAUSE_LINE, SCRIPT

pytestmark = pytest.mark.protocol("§9")


def draining_since(server: ServerHandle) -> int | None:
    """Index in ``state.received`` of the first ``status`` that says draining, if any."""
    for index, entry in enumerate(server.state.received):
        if isinstance(entry.message, Status) and entry.message.draining:
            return index
    return None


async def first_signal(server: ServerHandle, harness: HarnessProcess, signum: int) -> int:
    """Send the first signal; return once the server has heard the harness drain.

    Waiting matters: trio coalesces a signal that arrives again before the first one
    was handled, so a second signal sent too soon would be lost.
    """
    harness.send_signal(signum)
    await server.wait_until(lambda s: draining_since(server) is not None)
    index = draining_since(server)
    assert index is not None
    return index


def tree_pids(pidfile: Path, run_id: str) -> list[int]:
    """The stubborn agent's own pid and its grandchild's, as it wrote them, as this
    test sees them (a confined agent's are its PID namespace's)."""
    return [host_pid(int(word), run_id) for word in pidfile.read_text().split()]


async def test_first_signal_drains(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with trio.fail_after(60):
        # A short heartbeat period, to see one sent while draining.
        async with gated_process(home, heartbeat_s=5) as (gate, server, harness):
            busy, [queued] = await busy_and_queued(server, gate, "B")

            drained_at = await first_signal(server, harness, signal.SIGTERM)

            # The queued run is reported at once, while `busy` still runs.
            await server.wait_until(finished(queued))
            assert server.run(queued).completion == {
                "run_id": queued, "ok": False, "error": NOT_STARTED,
                "retryable": True}
            assert gate.running == 1 and server.run(busy).completion is None

            # New work is refused with 503.
            refused = await server.submit_run("too late", conversation_id="C")
            await server.wait_until(lambda s: len(s.runs[refused].acks) > 0)
            assert server.run(refused).ack_statuses == [503]

            # The socket stays up: pings are answered, heartbeats go on.
            await server.send_raw(json.dumps({"type": "ping", "id": "drain-ping"}))
            await server.wait_until(lambda s: any(
                isinstance(m, Pong) and m.id == "drain-ping"
                for m in s.messages(Pong)))

            def beats_after_drain(state: object) -> list[Heartbeat]:
                return [e.message for e in server.state.received[drained_at:]
                        if isinstance(e.message, Heartbeat)]

            await server.wait_until(lambda s: len(beats_after_drain(s)) > 0)
            beat = beats_after_drain(server.state)[0]
            assert (busy, "running") in [(r.run_id, r.state) for r in beat.runs]
            assert server.state.connected == 1

            # The running run finishes normally, then the harness exits 0.
            await gate.release(busy, "finished anyway")
            await server.wait_until(finished(busy))
            assert server.run(busy).reply == "finished anyway"
            assert await harness.proc.wait() == 0
    assert gate.started == [busy]
    for run_id in (busy, queued):
        assert ledger_row(home, run_id).state is RunState.REPORTED


async def test_second_signal_stops_the_agents_and_exits_130(tmp_path: Path) -> None:
    home = tmp_path / "home"
    pidfile = logs_folder(tmp_path) / "tree.pids"
    pids: list[int] = []
    with trio.fail_after(60):
        async with paired_with_gate(home, also_kill=pids) as (gate, server):
            command = agent_command("stubborn_tree.py", gate.port, pidfile)
            async with harness_process(server, home, command) as harness:
                run_id = await start_run(server, gate, "long job")
                pids = tree_pids(pidfile, run_id)
                assert all(alive(pid) for pid in pids)

                await first_signal(server, harness, signal.SIGTERM)
                assert all(alive(pid) for pid in pids)  # draining waits for it
                harness.send_signal(signal.SIGTERM)
                # §9 says within 5 s; this only bounds a hang.
                with trio.fail_after(30):
                    assert await harness.proc.wait() == 130

            # Reported before the harness exited, not left for the next start.
            # The agent had started: the completion names its account (§12) and
            # says it ran confined (§13, the default).
            # Like every completion, it says how long the run ran (§7, issue 37).
            completion = dict(server.run(run_id).completion or {})
            assert isinstance(completion.pop("duration_ms", None), int)
            assert completion == {
                "run_id": run_id, "ok": False, "error": STOPPED, "retryable": True,
                "account": "default", "confined": True}
            assert server.run(run_id).completion_posts == 1
            assert ledger_row(home, run_id).state is RunState.REPORTED
            # The grandchild ignores SIGTERM: only the SIGKILL after the grace ends it.
            for pid in pids:
                assert await wait_gone(pid), f"agent process {pid} outlived the harness"


#: §9's window, from the second signal to the process's exit.
STOP_WINDOW_S = 5.0
#: Only for what the window cannot include: the signal's delivery and the kernel
#: reaping the process (the harness is up long before; no start-up is counted).
EXIT_MARGIN_S = 1.0


def faulty_prohost(*, hang_while: str) -> tuple[str, ...]:
    """`python -m prohost` whose ledger hangs at each COMMIT while the FIFO
    ``hang_while`` exists (the soak's faulty ledger, scripts/soaklib/faulty_ledger.py)."""
    return (sys.executable, str(SCRIPTS / "soaklib" / "faulty_ledger.py"),
            "--hang-while", hang_while, "--")


async def test_a_hung_ledger_write_does_not_stretch_the_second_signal_past_5_s(
    tmp_path: Path,
) -> None:
    """Issue 27, point 4: closing the ledger after the supervisor took 2 s more."""
    home = tmp_path / "home"
    fifo = tmp_path / "hung-disk"
    with trio.fail_after(60):
        async with gated_process(home, program=faulty_prohost(hang_while=str(fifo))) as (
            gate, server, harness,
        ):
            await start_run(server, gate, "long job")
            os.mkfifo(fifo)  # from now on every ledger COMMIT hangs
            await first_signal(server, harness, signal.SIGINT)
            harness.send_signal(signal.SIGINT)
            signalled = trio.current_time()
            assert await harness.proc.wait() == 130
            took = trio.current_time() - signalled
            assert took <= STOP_WINDOW_S + EXIT_MARGIN_S, f"exited {took:.1f} s after the signal"
            await harness.wait_log_closed()
            assert harness.tracebacks() == []
    # The disk did hang (the faulty ledger was in effect): the stop's window ran out
    # on it, and the harness exited anyway.
    assert any("the stop's 5 s are over" in line for line in harness.log), harness.log


async def test_third_signal_exits_130_at_once_and_kills_the_agents(tmp_path: Path) -> None:
    home = tmp_path / "home"
    pidfile = logs_folder(tmp_path) / "tree.pids"
    pids: list[int] = []
    with trio.fail_after(60):
        async with paired_with_gate(home, also_kill=pids) as (gate, server):
            # Nothing in this agent's tree dies of SIGTERM: the second signal's stop
            # would wait out its whole grace before the SIGKILL.
            command = agent_command("stubborn_tree.py", gate.port, pidfile,
                                    "--leader-ignores-term")
            async with harness_process(server, home, command) as harness:
                run_id = await start_run(server, gate, "long job")
                pids = tree_pids(pidfile, run_id)

                await first_signal(server, harness, signal.SIGINT)
                harness.send_signal(signal.SIGTERM)
                await harness.wait_log("again: stopping the running agents")
                harness.send_signal(signal.SIGINT)
                with trio.fail_after(30):
                    assert await harness.proc.wait() == 130

            # It did not wait for the stop: the run was never reported, and stays
            # `started` in the ledger for the next start to report (§7).
            assert server.run(run_id).completion_posts == 0
            assert ledger_row(home, run_id).state is RunState.STARTED
            assert any("a third time" in line for line in harness.log)
            for pid in pids:
                assert await wait_gone(pid), f"agent process {pid} outlived the harness"


# --- signals at the edges of the process (issue 8, reproduction 9) --------------------

#: `python -m prohost` that says when its signal handlers are in place (a seam of the
#: test kit's, tests/kits/signal_edges.py: the product prints no such line).
EARLY = (sys.executable, SCRIPT, "--early-line", "--")


def paused_at_exit(wait_s: float) -> tuple[str, ...]:
    """`python -m prohost` that waits at its very end for a signal (the kit's seam)."""
    return (sys.executable, SCRIPT, "--pause-at-exit", str(wait_s), "--")


async def test_a_first_signal_before_the_supervisor_is_up_drains_and_exits_0(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with paired_with_gate(home) as (gate, server):
            # Queued before the harness starts: it would be delivered at its connect.
            waiting = await server.submit_run("delivered to a draining harness")
            async with harness_process(server, home, gate.command, connected=False,
                                       program=EARLY) as harness:
                # Printed by `python -m prohost` before it imports the harness: the
                # supervisor, its panel and the ledger are not there yet.
                assert await harness.wait_first_line() == EARLY_LINE
                harness.send_signal(signal.SIGTERM)
                assert await harness.wait_clean_exit() == 0
    assert any("SIGTERM (received while starting): draining" in line
               for line in harness.log)
    assert gate.started == []  # it started nothing
    assert server.run(waiting).completion is None


async def test_two_signals_before_the_supervisor_is_up_stop_and_exit_130(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        async with gated_process(tmp_path / "home", connected=False,
                                 program=EARLY) as (gate, _, harness):
            assert await harness.wait_first_line() == EARLY_LINE
            # Two different signals: two of the same one sent back to back could
            # be merged by the kernel into one.
            harness.send_signal(signal.SIGTERM)
            harness.send_signal(signal.SIGINT)
            assert await harness.wait_clean_exit() == 130
    assert gate.started == []


async def test_a_second_signal_after_the_drain_finished_exits_130_not_by_the_signal(
    tmp_path: Path,
) -> None:
    # The process waits at its very end (after the ledger is closed and the lock
    # released) until a signal comes: the last window, hit every time.
    with trio.fail_after(60):
        async with gated_process(tmp_path / "home",
                                 program=paused_at_exit(30)) as (_, _, harness):
            harness.send_signal(signal.SIGTERM)  # nothing runs: it drains at once
            await harness.wait_log("drained: every run has finished and reported")
            await harness.wait_log(EXIT_PAUSE_LINE)
            harness.send_signal(signal.SIGTERM)
            # §9: a second signal means 130 — not −15, the default action's status.
            assert await harness.wait_clean_exit() == 130


async def test_a_drain_without_a_second_signal_still_exits_0_after_the_pause(
    tmp_path: Path,
) -> None:
    """The counterpart of the test above: the pause alone changes nothing."""
    with trio.fail_after(60):
        async with gated_process(tmp_path / "home",
                                 program=paused_at_exit(0.01)) as (_, _, harness):
            harness.send_signal(signal.SIGTERM)
            assert await harness.wait_clean_exit() == 0
    assert any(EXIT_PAUSE_LINE in line for line in harness.log)
