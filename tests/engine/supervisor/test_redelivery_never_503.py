"""A redelivery of a run this harness holds or has reported is answered by the ledger
in every state (docs/protocol.md §3, issue 16 point 2).

A 503 tells the server to send the run elsewhere; sent elsewhere while it is queued
or running here, it runs twice. So a run this harness is running, has queued or
has reported gets 200 or 204 while the harness drains, while its queue is full and
while every account is limited; only a run new to it gets the 503, and a 503 for a
run the harness might know is sent only when the ledger cannot be read.

Real parts: the reference server on 127.0.0.1, the production harness, the sqlite
ledger, and the test-driven agent of tests/kits/harness.py (:class:`tests.kits.harness.Gate`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio

from prohost.engine.accounts.limits import LimitNotice
from prohost.engine.ledger import Ledger, LedgerError, RunState
from prohost.engine.ledger.steps import LedgerSteps
from prohost.engine.supervisor.admission import NOT_LOOKED_UP, NOT_RECORDED
from prohost.wire import intake
from prohost.wire.outcomes import NOT_STARTED, all_limited_reason
from prohost.wire.runs import parse_body
from tests.kits.harness import (
    Running,
    ack_to,
    busy_and_queued,
    counted_steps,
    finished,
    gated_harness,
    released,
    run_body,
)

pytestmark = pytest.mark.protocol("§3")


async def redelivered(running: Running, run_id: str, delivery_id: str) -> tuple[int, str]:
    """The ack to ``run_id``'s own body, delivered again (signed as the server signs)."""
    ack = await ack_to(running, running.server.run(run_id).body_text, delivery_id)
    return ack.status, ack.reason


def refuse_new_work(running: Running, state: str) -> str:
    """Put the harness in ``state``; return the 503 reason a new run then gets."""
    harness = running.harness
    if state == "draining":
        harness.drain()
        return intake.SHUTTING_DOWN
    if state == "limited":
        until = time.time() + 3600
        harness.book.report("default", LimitNotice(state="limited", resets_at=until),
                            time.time())
        return all_limited_reason(until)
    # "queue full": --max-queued 1 and one run queued already.
    assert harness.scheduler.statistics().queued >= harness.options.max_queued
    return intake.QUEUE_FULL


@pytest.mark.protocol("§9", "§12")
@pytest.mark.parametrize("state", ["draining", "queue full", "limited"])
async def test_a_run_held_or_reported_here_is_never_answered_503(
    tmp_path: Path, state: str
) -> None:
    with trio.fail_after(60):
        async with gated_harness(tmp_path, max_queued=1) as (gate, running):
            server, harness = running.server, running.harness
            done = await server.submit_run("done already", conversation_id="D")
            await gate.wait_started(done)
            await gate.release(done, "the first answer")
            await server.wait_until(finished(done))
            await released(harness, done)
            # One running (the Gate holds it, in the one slot) and one queued behind it.
            busy, [queued] = await busy_and_queued(server, gate, "B")
            refusal = refuse_new_work(running, state)

            assert await redelivered(running, busy, "again-busy") == (200, "already accepted")
            assert await redelivered(running, done, "again-done") == (204, "already reported")
            if state == "draining":
                # The drain hands the queued run back: reported "not started", and its
                # redelivery then gets the ledger's 204.
                await released(harness, queued)
                # Its `reported` row is queued for the writer without a wait, and a
                # redelivery is answered from the last commit (issue 27.6): a lookup,
                # which waits for what is queued, makes that commit the ledger's.
                row = await harness.steps.lookup(queued)
                assert row is not None and row.state is RunState.REPORTED
                assert await redelivered(running, queued, "again-queued") == (
                    204, "already reported")
                completion = server.run(queued).completion
                assert completion is not None and completion["error"] == NOT_STARTED
            else:
                assert await redelivered(running, queued, "again-queued") == (
                    200, "already accepted")
            # Only a run new to the harness is refused.
            ack = await ack_to(running, run_body("r_new"), "new")
            assert (ack.status, ack.reason) == (503, refusal)
            assert "r_new" not in harness.held

            await gate.release(busy, "the busy answer")
            await server.wait_until(finished(busy))
            # Each ran once and was reported once, whatever it was told meanwhile.
            assert gate.started.count(busy) == 1 and gate.started.count(done) == 1
            for run_id in (busy, done):
                assert server.run(run_id).completion_posts == 1
            if state == "draining":
                assert await running.wait_exit() == 0
                assert queued not in gate.started


class UnreadableLedger:
    """The harness's ledger with its reads of a run failing (a disk I/O error)."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self.reads = 0

    def get(self, run_id: str) -> Any:
        self.reads += 1
        raise LedgerError("disk I/O error on a read (test)")

    committed = get

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)


@pytest.mark.protocol("§9")
async def test_while_draining_a_ledger_that_cannot_be_read_gets_503_but_a_held_run_does_not(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        async with gated_harness(tmp_path) as (gate, running):
            server, harness = running.server, running.harness
            done = await server.submit_run("done already", conversation_id="D")
            await gate.wait_started(done)
            await gate.release(done)
            await released(harness, done)
            busy = await server.submit_run("busy", conversation_id="B")
            await gate.wait_started(busy)
            assert running.ledger is not None
            unreadable = UnreadableLedger(running.ledger)
            harness.admission.steps = LedgerSteps(unreadable, harness.bounds)  # type: ignore[arg-type]
            harness.drain()

            # Held in memory: answered without asking the ledger.
            assert await redelivered(running, busy, "again-busy") == (200, "already accepted")
            assert unreadable.reads == 0
            # Not held: only the ledger knows it was reported; it cannot say, so 503.
            assert await redelivered(running, done, "again-done") == (503, NOT_LOOKED_UP)
            assert unreadable.reads == 1
            harness.admission.steps = harness.steps
            assert await redelivered(running, done, "later-done") == (204, "already reported")
            await gate.release(busy)
            assert await running.wait_exit() == 0


async def test_a_ledger_that_cannot_record_still_answers_for_the_runs_it_has(
    tmp_path: Path,
) -> None:
    """A full disk: a new run gets 503, but a reported one its 204, and one the ledger
    holds unreported (its ack was lost) its 200, and it is taken on, not run twice."""
    with trio.fail_after(60):
        async with gated_harness(tmp_path) as (gate, running):
            server, harness, ledger = running.server, running.harness, running.ledger
            assert ledger is not None
            done = await server.submit_run("done already", conversation_id="D")
            await gate.wait_started(done)
            await gate.release(done, "the answer")
            await released(harness, done)
            # Recorded by a delivery whose ack never went out: the ledger has it, nothing
            # here holds it.
            left = server.state.add_run("left behind", "L").run_id
            body = server.run(left).body_text
            harness.admission.steps = LedgerSteps(  # type: ignore[arg-type]
                FullDisk(ledger), harness.bounds)
            ledger.admit(left, parse_body(body).lane, body, time.time())

            assert await redelivered(running, done, "again-done") == (204, "already reported")
            ack = await ack_to(running, run_body("r_new"), "new")
            assert (ack.status, ack.reason) == (503, NOT_RECORDED)
            await gate.wait_started(left)
            await gate.release(left, "ran once")
            await server.wait_until(finished(left))
            await released(harness, left)
            assert [a.status for a in server.run(left).acks][:1] == [200]
            assert gate.started.count(left) == 1
            assert server.run(left).completion_posts == 1
            row = ledger.get(left)
            assert row is not None and row.state is RunState.REPORTED


class FullDisk:
    """The harness's ledger with ``admit`` failing the way a full disk fails it."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    def admit(self, *args: Any, **kwargs: Any) -> Any:
        raise LedgerError("database or disk is full (test)")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)


async def test_the_ledgers_answer_costs_no_extra_worker_thread_hop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A held run is answered from memory; a new run in the normal state costs the
    one hop of its ledger write (which would also have found a known run); only
    while new work is refused does a delivery cost one read."""
    hops = counted_steps(monkeypatch)

    def of(run_id: str) -> list[str]:
        return [what for what in hops if run_id in what]

    with trio.fail_after(60):
        async with gated_harness(tmp_path) as (gate, running):
            server = running.server
            busy = await server.submit_run("busy", conversation_id="B")
            await gate.wait_started(busy)
            before = len(of(busy))
            assert await redelivered(running, busy, "again") == (200, "already accepted")
            assert len(of(busy)) == before
            assert (await ack_to(running, run_body("r_new"), "new")).status == 200
            assert of("r_new") == ["recording run r_new in the ledger"]
            running.harness.drain()
            assert (await ack_to(running, run_body("r_late"), "late")).status == 503
            assert of("r_late") == ["looking run r_late up in the ledger"]
            # r_new was queued behind busy: the drain reported it "not started".
            await gate.release(busy)
            assert await running.wait_exit() == 0
            assert gate.started == [busy]


@pytest.mark.protocol("§9")
async def test_while_draining_a_run_the_ledger_has_but_nobody_holds_is_answered_and_reported(
    tmp_path: Path,
) -> None:
    """Its first ack was lost (the row is ``accepted``, nothing here holds it): the
    redelivery during a drain is 200, and the run is reported "not started" at once,
    not refused to be run elsewhere while this ledger still has it."""
    with trio.fail_after(60):
        async with gated_harness(tmp_path) as (gate, running):
            server, harness, ledger = running.server, running.harness, running.ledger
            assert ledger is not None
            busy = await server.submit_run("busy", conversation_id="B")
            await gate.wait_started(busy)
            harness.drain()
            # No checkpoint between these: the row is there before the delivery is read.
            left = server.state.add_run("left behind", "L").run_id
            body = server.run(left).body_text
            ledger.admit(left, parse_body(body).lane, body, time.time())
            await server.wait_until(lambda s: bool(s.runs[left].acks))
            record = server.run(left)
            assert [(a.status, a.reason) for a in record.acks] == [(200, "already accepted")]
            await server.wait_until(finished(left))
            assert record.completion == {"run_id": left, "ok": False, "retryable": True,
                                         "error": NOT_STARTED}
            await gate.release(busy)
            assert await running.wait_exit() == 0
            assert gate.started == [busy]
