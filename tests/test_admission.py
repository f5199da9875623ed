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

import pytest
import trio

from prohost.engine.ledger import Ledger, LedgerError, Recovery, RunState
from prohost.engine.recovery import INTERRUPTED
from prohost.wire.runs import Outcome, parse_body
from tests.kit import agent_command, finished, running_harness, running_server


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
            await running.harness.wait_released(run_id)

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


async def test_a_delivery_whose_ledger_write_committed_but_failed_runs_on_its_resend(
    tmp_path: Path,
) -> None:
    """The write commits and then raises (a disk error after the commit): the ack
    is 503, the server resends, and the resend finds the row and runs it."""
    home = tmp_path / "home"

    class FailsAfterCommit:
        def __init__(self, ledger: Ledger) -> None:
            self._ledger = ledger
            self.failed = 0

        def admit(self, *args: Any) -> Any:
            result = self._ledger.admit(*args)
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
            running.harness.ledger = wrapped  # type: ignore[assignment]
            run_id = server.state.add_run("commit, then an error", "C2").run_id
            await server.wait_until(finished(run_id))
            await running.harness.wait_released(run_id)

            record = server.run(run_id)
            assert [ack.status for ack in record.acks] == [503, 200]
            assert record.completion is not None
            assert record.completion.get("reply") == "ran once"
            assert wrapped.failed == 1
            assert ledger.recover() == Recovery(pending=[], interrupted=[], outbox=[])
