"""A run the ledger has but nothing in the harness holds is taken on at its redelivery.

Such a row is what a delivery leaves when its ledger write went through but its
ack did not (the connection dropped mid-admission, the write outlived its bound,
or failed after its commit), and what a report that failed unexpectedly leaves.
Before, the redelivery was answered 200 "already accepted" and the run then
waited, unanswered, for the next start or the end of a drain.

Real parts throughout: the reference server on 127.0.0.1, the production harness,
the sqlite ledger, and a plain agent subprocess.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from prohost.engine.ledger import Ledger, LedgerError, RunState, UnreportedRuns
from prohost.engine.ledger.steps import LedgerSteps
from prohost.engine.run.heldrun import HeldRun
from prohost.engine.run.progress import Progress
from prohost.engine.view.status_file import status_message
from prohost.wire.outcomes import INTERRUPTED
from prohost.wire.runs import AgentRun, Outcome, parse_body
from tests.kits.harness import agent_command, finished, released, running_harness, running_server
from tests.kits.paths import logs_folder


@pytest.mark.protocol("§3", "§7")
@pytest.mark.parametrize("left_as", ["accepted", "started", "finished"])
async def test_a_redelivered_run_the_ledger_holds_but_nobody_runs_is_taken_on(
    tmp_path: Path, left_as: str
) -> None:
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=agent_command("reply.py", "ran now"),
        ) as running:
            ledger = running.ledger
            assert ledger is not None
            # No checkpoint between these: the row is in the ledger before the
            # harness reads the delivery, as a cut-short admission would leave it.
            run_id = server.state.add_run("left behind", "C1").run_id
            body = server.run(run_id).body_text
            ledger.admit(run_id, parse_body(body).lane, body, time.time())
            if left_as != "accepted":
                ledger.mark_started(run_id, time.time())
            if left_as == "finished":
                ledger.mark_finished(run_id, Outcome(ok=True, reply="the saved answer")
                                     .to_json(), time.time())

            await server.wait_until(finished(run_id))
            await released(running.harness, run_id)

            record = server.run(run_id)
            assert [(ack.status, ack.reason) for ack in record.acks] == [
                (200, "already accepted")]
            expected = {
                "accepted": ("ran now", None),  # queued and run, once
                "started": (None, INTERRUPTED),  # nothing here runs it any more
                "finished": ("the saved answer", None),  # reported as saved, not rerun
            }[left_as]
            completion = record.completion
            assert completion is not None
            assert (completion.get("reply"), completion.get("error")) == expected
            row = ledger.get(run_id)
            assert row is not None and row.state is RunState.REPORTED


@pytest.mark.protocol("§3", "§7")
async def test_a_delivery_whose_ledger_write_committed_but_failed_runs_once(
    tmp_path: Path,
) -> None:
    """The write commits and then raises (a disk error after the commit): the ledger
    is read before a 503 is sent, finds the row, and the run is acked 200 and run,
    once (a 503 would send it elsewhere, while the ledger here has it)."""
    home = tmp_path / "home"

    class FailsAfterCommit:
        #: Its steps take a worker thread (as a sync caller's), where the real
        #: admit commits before this raises; on the writer thread a call that
        #: raises has its writes dropped.
        serving = False

        def __init__(self, ledger: Ledger) -> None:
            self._ledger = ledger
            self.failed = 0

        def admit(self, *args: Any, **kwargs: Any) -> Any:
            result = self._ledger.admit(*args, **kwargs)
            if not self.failed:
                self.failed += 1
                raise LedgerError("disk I/O error after the commit (test)")
            return result

        def __getattr__(self, name: str) -> Any:
            return getattr(self._ledger, name)

    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, home, exec_command=agent_command("reply.py", "ran once"),
        ) as running:
            ledger = running.ledger
            assert ledger is not None
            wrapped = FailsAfterCommit(ledger)
            running.harness.admission.steps = LedgerSteps(  # type: ignore[arg-type]
                wrapped, running.harness.bounds)
            run_id = server.state.add_run("commit, then an error", "C2").run_id
            await server.wait_until(finished(run_id))
            await released(running.harness, run_id)

            record = server.run(run_id)
            assert [(ack.status, ack.reason) for ack in record.acks] == [
                (200, "already accepted")]
            assert record.completion is not None
            assert record.completion.get("reply") == "ran once"
            assert wrapped.failed == 1
            assert ledger.recover() == UnreportedRuns(pending=[], interrupted=[], outbox=[])


@pytest.mark.parametrize("text_budget", ["ample", "spent"])
async def test_a_queued_run_is_held_light_and_runs_with_its_whole_body(
    tmp_path: Path, text_budget: str
) -> None:
    """A queued run keeps no parsed body, cancel scope or Progress in memory (10,000
    of them would be most of the harness's memory), not even once heartbeats and the
    status have listed it; past the budget for queued texts, not even its text. When
    it starts, its body comes back whole (from the ledger, past the budget)."""
    prompt_file = logs_folder(tmp_path) / "prompt.txt"
    text = "the whole request, " + "x" * 4096
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home",
            exec_command=agent_command("reply.py", "--prompt-to", prompt_file, "answered"),
        ) as running:
            harness = running.harness
            if text_budget == "spent":
                harness.bodies.budget = 0
            # The lane is kept busy, so the run waits in the queue, as behind a full
            # machine.
            async with harness.scheduler.holding("conv:C1"):
                run_id = await server.submit_run(text, conversation_id="C1")
                await server.wait_until(lambda s: s.runs[run_id].state == "accepted")
                held = harness.held[run_id]
                # What a heartbeat and the status file read of every queued run.
                assert held.beat().state == "queued"
                harness.snapshot()  # the panel's and status.json's picture
                status_message(harness.observed)
                assert held.state == "queued"
                for field in attrs.fields(HeldRun):
                    value = getattr(held, field.name)
                    assert not isinstance(value, AgentRun | trio.CancelScope | Progress), \
                        f"a queued run holds its {field.name}"
                    if text_budget == "spent":
                        assert not (isinstance(value, str) and len(value) > 1000), \
                            f"a queued run holds its body in {field.name}"
                assert harness.bodies.chars == (len(server.run(run_id).body_text)
                                                     if text_budget == "ample" else 0)
            await server.wait_until(finished(run_id))
            completion = server.run(run_id).completion
            assert completion is not None and completion["reply"] == "answered"
            assert text in prompt_file.read_text()
            assert harness.bodies.chars == 0


@pytest.mark.protocol("§7")
async def test_a_queued_run_whose_body_cannot_be_read_back_is_reported_not_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Past the budget for queued texts, the read of a queued run's body fails (a
    disk error): the run is not started, but it is reported at once, retryable, as
    an internal error (a run left in the ledger would wait, unanswered, for the
    next start), and the harness goes on with the next run."""

    class BodyFailsOnce:
        def __init__(self, ledger: Ledger) -> None:
            self._ledger = ledger
            self.failed = 0

        def body(self, run_id: str) -> str | None:
            if not self.failed:
                self.failed += 1
                raise LedgerError("disk I/O error on a read (test)")
            return self._ledger.body(run_id)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._ledger, name)

    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=agent_command("reply.py", "ran"),
        ) as running:
            ledger = running.ledger
            assert ledger is not None
            wrapped = BodyFailsOnce(ledger)
            runner = running.harness.runner
            assert runner is not None
            runner.steps.ledger = wrapped  # type: ignore[assignment]
            running.harness.bodies.budget = 0  # every queued body is in the ledger only
            # The lane is kept busy, so the run waits in the queue (one that starts
            # at once keeps its parsed body, and is never read back).
            async with running.harness.scheduler.holding("conv:C1"):
                lost = await server.submit_run("unlucky", conversation_id="C1")
                await server.wait_until(lambda s: s.runs[lost].state == "accepted")
            await server.wait_until(finished(lost))
            await released(running.harness, lost)
            after = await server.submit_run("next", conversation_id="C2")
            await server.wait_until(finished(after))

            assert wrapped.failed == 1
            completion = server.run(lost).completion
            assert completion is not None
            assert completion["ok"] is False and completion["retryable"] is True
            assert completion["error"].startswith(
                "internal error: could not read the run back from the ledger: ")
            assert "reply" not in completion  # the agent never ran for it
            assert server.run(lost).completion_posts == 1
            row = ledger.get(lost)
            assert row is not None and row.state is RunState.REPORTED
            assert f"run {lost}: could not read the run back from the ledger" in caplog.text
            assert server.run(after).completion["reply"] == "ran"
