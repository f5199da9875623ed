"""§7 crash recovery: the harness process is killed with SIGKILL, then started again.

Every harness here is a real ``python -m prohost agent run`` subprocess on a home
paired with the in-process reference server; its ledger is the real sqlite file
in that home. The agents are the test's gated fakes (tests/kits/harness.py ``Gate``).
Nothing sleeps: the tests wait on server state, the Gate, the harness's log and
process exits.

The subprocess helpers are in tests/kits/process.py.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
from pathlib import Path

import pytest
import trio

from prohost.engine.ledger import RunState
from prohost.wire.outcomes import NOT_STARTED, RESTARTED
from tests.kits.harness import (
    agent_command,
    busy_and_queued,
    finished,
    pair_home,
    running_server,
    start_run,
)
from tests.kits.paths import AGENTS, logs_folder
from tests.kits.process import (
    alive,
    harness_process,
    kill_harness,
    ledger_row,
    paired_with_gate,
    redeliver,
    until,
    wait_gone,
)

pytestmark = pytest.mark.protocol("§7")



def hardy_reads(home: Path) -> list[str]:
    """hardy.py reads the harness's ledger to see its process group recorded: a
    confined run sees nothing of ``$PROHOST_HOME`` (§13) unless it is opened to it."""
    return ["--allow-read", str(home)]

async def test_after_a_kill_the_interrupted_run_is_reported_and_killed_and_queued_runs_resume(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with paired_with_gate(home) as (gate, server):
            command = agent_command("hardy.py", gate.port)
            async with harness_process(server, home, command,
                                       extra_args=hardy_reads(home)) as first:
                # One slot, and it is taken: the waiting runs are accepted but never start.
                busy, waiting = await busy_and_queued(server, gate, "B", "C")
                await kill_harness(server, first)

            # The scene the restarted harness finds: an agent left running (it
            # outlives its harness), its group in the ledger, two runs never started.
            agent_pid = gate.pids[busy]
            assert alive(agent_pid)
            row = ledger_row(home, busy)
            assert row.state is RunState.STARTED
            assert row.pgid == os.getpgid(agent_pid)
            assert [ledger_row(home, r).state for r in waiting] == [RunState.ACCEPTED] * 2
            assert gate.started == [busy]

            async with harness_process(server, home, command,
                                       extra_args=hardy_reads(home)) as second:
                assert await wait_gone(agent_pid), "the leftover agent is still alive"
                # The accepted runs run now, in the order accepted; `busy` never
                # runs again.
                for count, run_id in enumerate(waiting, start=2):
                    await gate.wait(lambda g, count=count: len(g.started) == count)
                    assert gate.started[-1] == run_id
                    await gate.release(run_id, f"answer to {run_id}")
                await server.wait_until(finished(busy))
                restarted = dict(server.run(busy).completion or {})
                # It says how long it ran, up to the restart (§7).
                assert isinstance(restarted.pop("duration_ms"), int)
                assert restarted == {
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


async def test_after_a_kill_a_finished_unreported_run_posts_its_saved_outcome(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with paired_with_gate(home) as (gate, server):
            # The server is down for completions: the report keeps being retried.
            server.state.completion_faults.extend([(503, {})] * 100)
            async with harness_process(server, home, gate.command) as first:
                run_id = await start_run(server, gate, "work")
                await gate.release(run_id, "the saved answer")
                # A completion POST is made only after the outcome is in the ledger.
                await server.wait_until(lambda s: s.runs[run_id].completion_posts >= 1)
                await kill_harness(server, first)

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


@pytest.mark.protocol("§3")
async def test_after_a_kill_redeliveries_are_never_executed_twice(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with paired_with_gate(home) as (gate, server):
            command = agent_command("hardy.py", gate.port)
            async with harness_process(server, home, command,
                                       extra_args=hardy_reads(home)) as first:
                done = await start_run(server, gate, "quick", conversation_id="D")
                await gate.release(done, "quick answer")
                await server.wait_until(finished(done))
                # One slot: it frees for `interrupted` only once `done` is reported in
                # the ledger.
                interrupted, [pending] = await busy_and_queued(server, gate, "B")
                await kill_harness(server, first)
            assert ledger_row(home, done).state is RunState.REPORTED

            # Keep the interrupted run's restart report unsettled for now (Retry-After
            # keeps the retries from hammering), so it stays `finished` in the ledger.
            server.state.completion_faults.extend([(503, {"Retry-After": "1"})] * 100)
            async with harness_process(server, home, command,
                                       extra_args=hardy_reads(home)) as second:
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


@pytest.mark.protocol("§9")
async def test_a_first_signal_as_the_restarted_harness_starts_reports_both_runs_and_exits_0(
    tmp_path: Path,
) -> None:
    """Issue 8, reproduction 8: SIGTERM as soon as the restarted harness prints its
    first line, while it recovers the ledger. Whenever it lands, §9 holds: the
    interrupted run is reported "restarted", the queued one "not started", and the
    harness exits 0 only after both reports went out.
    (tests/engine/supervisor/test_recovery_during_a_drain.py pins the drain inside the
    recovery every time.)"""
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with paired_with_gate(home) as (gate, server):
            command = agent_command("hardy.py", gate.port)
            async with harness_process(server, home, command,
                                       extra_args=hardy_reads(home)) as first:
                busy, [queued] = await busy_and_queued(server, gate, "B")
                await kill_harness(server, first)

            async with harness_process(server, home, command, connected=False,
                                       extra_args=hardy_reads(home)) as second:
                await second.wait_first_line()
                second.send_signal(signal.SIGTERM)

                async def finish_if_started() -> None:
                    # On a loaded machine the signal can land only after recovery
                    # queued and started the waiting run; a drain then lets it finish.
                    await gate.wait_started(queued)
                    await gate.release(queued)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(finish_if_started)
                    assert await second.wait_clean_exit() == 0
                    nursery.cancel_scope.cancel()
            restarted = dict(server.run(busy).completion or {})
            assert isinstance(restarted.pop("duration_ms"), int)  # up to the restart (§7)
            assert restarted == {
                "run_id": busy, "ok": False, "error": RESTARTED, "retryable": True}
            if queued in gate.started:
                assert server.run(queued).completion["ok"] is True
            else:
                assert server.run(queued).completion == {
                    "run_id": queued, "ok": False, "error": NOT_STARTED, "retryable": True}
            assert gate.started in ([busy], [busy, queued])  # nothing ran twice
            for run_id in (busy, queued):
                assert ledger_row(home, run_id).state is RunState.REPORTED


@pytest.mark.protocol("§5")
async def test_after_a_kill_the_next_turn_resumes_the_session_the_last_one_ended_with(
    tmp_path: Path,
) -> None:
    """The lane's session is written without waiting for an fsync, queued just before
    the turn's `finished`: once the server has the turn's result, it is on disk, and
    a harness killed then resumes it for the conversation's next turn."""
    home = tmp_path / "home"
    record = logs_folder(tmp_path) / "record.json"
    # Named `claude`, so the harness picks the Claude brain (--brain auto).
    claude = tmp_path / "bin" / "claude"
    claude.parent.mkdir()
    fake = AGENTS / "fake_claude.py"
    claude.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} "
                      f"{shlex.quote(str(fake))} \"$@\"\n")
    claude.chmod(0o755)
    env = {"FAKE_CLAUDE_RECORD": str(record)}
    with trio.fail_after(60):
        async with running_server() as server:
            pair_home(server, home)
            async with harness_process(server, home, str(claude), extra_env=env) as first:
                turn_1 = await server.submit_run("first turn", conversation_id="A")
                await server.wait_until(finished(turn_1))
                await kill_harness(server, first)
            completion = server.run(turn_1).completion
            assert completion is not None and completion["ok"] is True
            session = completion["session_id"]
            assert session

            async with harness_process(server, home, str(claude), extra_env=env) as second:
                turn_2 = await server.submit_run("second turn", conversation_id="A")
                await server.wait_until(finished(turn_2))
                second.send_signal(signal.SIGTERM)
                assert await second.proc.wait() == 0
    calls = json.loads(record.read_text())
    assert [call["env"]["PROHOST_RUN_ID"] for call in calls] == [turn_1, turn_2]
    assert not [arg for arg in calls[0]["argv"] if arg.startswith("--resume")]
    assert f"--resume={session}" in calls[1]["argv"]
    second_completion = server.run(turn_2).completion
    assert second_completion is not None and second_completion["session_id"] == session
