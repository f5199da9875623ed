"""``prohost agent cancel RUN`` (issue 40, point 3): one run cancelled from this
machine as a server's cancel would (§6: final, reported ``cancelled``, not
retryable, never run again), where ``agent stop --now`` hands it back to be run
again. Every part is real: the reference server (port 0, retrying a retryable
failure at once, so a wrong report shows as a second start), a ``prohost agent
run`` process whose agents are the Gate's, the command as its own process.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import trio

from prohost.engine.ledger import Ledger
from prohost.engine.supervisor.requests import ask_cancel, pending_cancels
from prohost.wire.runs import parse_body
from tests.kits.harness import finished, start_run
from tests.kits.lockholder import signalled, start_holder, stop_holder
from tests.kits.process import harness_process, paired_with_gate, wait_gone
from tests.kits.program import prohost, run_cli

pytestmark = pytest.mark.protocol("§6")

REASON = "cancelled: cancelled on its machine (prohost agent cancel)"


def said(result: object) -> str:
    return (getattr(result, "stdout", b"") + getattr(result, "stderr", b"")).decode()


async def test_a_running_and_a_queued_run_are_cancelled_for_good(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with trio.fail_after(90):
        async with paired_with_gate(home, retries=2, retry_first_s=0.0) as (gate, server):
            async with harness_process(server, home, gate.command) as harness:
                busy = await start_run(server, gate, "long job", conversation_id="A")
                queued = await server.submit_run("waiting behind it", conversation_id="B")
                await server.wait_until(lambda s: s.runs[queued].state == "accepted")

                # Both typed short: the queued one with run_, the running one without.
                done = await prohost(home, "agent", "cancel", queued[:10])
                assert done.returncode == 0, said(done)
                assert f"run {queued} cancelled" in said(done)
                done = await prohost(home, "agent", "cancel", busy.removeprefix("run_")[:6])
                assert done.returncode == 0, said(done)
                assert f"run {busy} cancelled" in said(done)
                assert await wait_gone(gate.pids[busy])
                await server.wait_until(finished(busy, queued))
                for run_id in (busy, queued):
                    completion = server.run(run_id).completion
                    assert completion is not None
                    assert completion["error"] == REASON, completion
                    assert completion["retryable"] is False
                # The harness went on: its log says why, and it takes the next run.
                await harness.wait_log(f"cancelling run {busy}: cancelled on its machine")
                assert harness.proc.returncode is None
                assert pending_cancels(home) == []

                # A run that has ended is said to have, with how it ended.
                again = await prohost(home, "agent", "cancel", busy)
                assert again.returncode == 1
                assert f"run {busy} has already ended: {REASON}" in said(again)
                assert (await prohost(home, "agent", "cancel", "run_nope")).returncode == 1
                both = await prohost(home, "agent", "cancel", "run_")
                assert both.returncode == 2 and busy in said(both) and queued in said(both)

                stopped = await prohost(home, "agent", "stop")
                assert stopped.returncode == 0, said(stopped)
                assert await harness.wait_clean_exit() == 0

            none = await prohost(home, "agent", "cancel", busy)
            assert none.returncode == 1 and "no prohost agent is running" in said(none)

            # Started again, the harness runs the conversation's next turn, and the
            # cancelled runs never again (nor does the server, which would retry a
            # retryable failure at once as a new run).
            async with harness_process(server, home, gate.command) as harness:
                after = await start_run(server, gate, "next turn", conversation_id="A")
                await gate.release(after, "fine")
                await server.wait_until(finished(after))
                harness.send_signal(signal.SIGINT)
                assert await harness.wait_clean_exit() == 0
    assert gate.started == [busy, after]
    assert server.run(busy).retried_as is None and server.run(queued).retried_as is None
    assert set(server.state.runs) == {busy, queued, after}


async def test_a_request_left_before_the_harness_started_is_obeyed_at_start(
    tmp_path: Path
) -> None:
    # The file is the request; the signal only says "look now". A request written
    # while no harness listened (a kill -9 between the two) is obeyed by the next
    # start: the queued run it names is reported cancelled, not retryable.
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with paired_with_gate(home) as (gate, server):
            async with harness_process(server, home, gate.command) as harness:
                await start_run(server, gate, "long job", conversation_id="A")
                queued = await server.submit_run("waiting behind it", conversation_id="B")
                await server.wait_until(lambda s: s.runs[queued].state == "accepted")
                await harness.kill()
            ask_cancel(home, queued)
            async with harness_process(server, home, gate.command) as harness:
                await server.wait_until(finished(queued))
                completion = server.run(queued).completion
                assert completion is not None and completion["error"] == REASON
                assert completion["retryable"] is False
                assert pending_cancels(home) == []
                harness.send_signal(signal.SIGINT)
                assert await harness.wait_clean_exit() == 0


def test_a_harness_that_does_not_read_requests_is_not_signalled(tmp_path: Path) -> None:
    # A harness of a version before `agent cancel` (or one still starting) says
    # nothing in the home: SIGUSR1's default action would end it, so none is sent,
    # and the request waits for a harness that reads it.
    home = tmp_path / "home"
    home.mkdir()
    body = json.dumps({"run_id": "run_0123abcd", "completion_path": "/runs/x/done",
                       "text": "hello", "conversation_id": "C1"})
    with Ledger.open(home / "ledger.sqlite3") as ledger:
        ledger.admit("run_0123abcd", parse_body(body).lane, body, 1_700_000_000.0)
    holder = start_holder(home, "harness")
    try:
        asked = run_cli(tmp_path, "agent", "cancel", "0123")
        assert not signalled(holder)
    finally:
        stop_holder(holder)
    assert asked.returncode == 1
    assert f"(pid {holder.pid}) does not read requests yet" in asked.stderr
    assert pending_cancels(home) == ["run_0123abcd"]


async def test_a_running_run_whose_request_outlived_a_kill_9_is_cancelled_not_restarted(
    tmp_path: Path
) -> None:
    # §6: a cancel is final once the harness holds it. `agent cancel` writes its
    # request, then a kill -9 hits before the harness read it: the next start must
    # read the request before it reports the interrupted run, or the run goes back
    # "restarted" (retryable) and the server runs the cancelled request again.
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with paired_with_gate(home, retries=2, retry_first_s=0.0) as (gate, server):
            async with harness_process(server, home, gate.command) as harness:
                busy = await start_run(server, gate, "long job", conversation_id="A")
                ask_cancel(home, busy)  # as the command writes it; no signal reached it
                await harness.kill()
            async with harness_process(server, home, gate.command) as harness:
                await server.wait_until(finished(busy))
                completion = server.run(busy).completion
                assert completion is not None and completion["error"] == REASON, completion
                assert completion["retryable"] is False
                assert await wait_gone(gate.pids[busy])
                await harness.wait_log(f"run {busy} was being cancelled when the harness "
                                       "stopped")
                assert pending_cancels(home) == []
                harness.send_signal(signal.SIGINT)
                assert await harness.wait_clean_exit() == 0
    assert gate.started == [busy]
    assert server.run(busy).retried_as is None and set(server.state.runs) == {busy}
