"""Admission (prohost.engine.supervisor.admission, §3) built from only the parts it
uses: a real sqlite ledger in ``tmp_path``, a real scheduler (not running: a queued
run stays queued), run queue, held-runs table and account book. The stand-ins are
the session (it collects the acks) and ``take_on`` and ``settle`` (they record).

tests/test_redelivery.py and tests/test_admission.py check the same answers end to
end through a harness; these pin each one to this module.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from prohost.engine.accounts.book import AccountBook
from prohost.engine.accounts.gate import all_limited_reason
from prohost.engine.accounts.limits import LimitNotice
from prohost.engine.lanes.scheduler import Scheduler
from prohost.engine.ledger import Ledger, LedgerError, RunState
from prohost.engine.ledger.steps import LedgerSteps
from prohost.engine.run.heldrun import HeldRun
from prohost.engine.run.queued_bodies import QueuedBodies
from prohost.engine.supervisor.admission import (
    NOT_LOOKED_UP,
    NOT_RECORDED,
    Admission,
    AdmissionPolicy,
)
from prohost.engine.supervisor.held import HeldRuns
from prohost.engine.supervisor.runqueue import RunQueue
from prohost.wire import intake
from prohost.wire.protocol import Ack, Delivery, Message
from prohost.wire.runs import Outcome
from prohost.wire.signature import sign

SECRET = "test-secret"


class Acks:
    """The session stand-in: every message admission sends, in order."""

    def __init__(self) -> None:
        self.sent: list[Message] = []

    async def send(self, message: Message) -> None:
        self.sent.append(message)


class Wrapped:
    """A ledger that records which of its methods are looked up, and can fail
    ``admit`` (a full disk) or ``get`` (an unreadable file) with LedgerError."""

    def __init__(self, ledger: Ledger, *, failing: tuple[str, ...] = ()) -> None:
        self._ledger = ledger
        self._failing = failing
        self.used: list[str] = []

    def __getattr__(self, name: str) -> Any:
        self.used.append(name)
        if name in self._failing:
            def fail(*args: object) -> Any:
                raise LedgerError(f"{name} failed (test)")
            return fail
        return getattr(self._ledger, name)


@attrs.define
class Parts:
    admission: Admission
    ledger: Ledger
    runs: HeldRuns
    queue: RunQueue
    scheduler: Scheduler[HeldRun]
    session: Acks
    taken_on: list[str]
    settled: list[tuple[str, Outcome]]


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    with Ledger.open(tmp_path / "ledger.sqlite3") as opened:
        yield opened


def build(ledger: Ledger, *, max_queued: int = 10, dry_run: bool = False,
          allow_unverified: bool = False) -> Parts:
    """Admission over real parts; its scheduler is never run, so nothing executes."""
    taken_on: list[str] = []
    settled: list[tuple[str, Outcome]] = []

    async def work(key: str, held: HeldRun) -> None:
        raise AssertionError("nothing runs in these tests")

    async def take_on(run_id: str) -> None:
        taken_on.append(run_id)

    def settle(held: HeldRun, outcome: Outcome, *, recorded: bool = False,
               finished_at: float | None = None) -> None:
        settled.append((held.run_id, outcome))

    scheduler: Scheduler[HeldRun] = Scheduler(2, work, queue_cap=100)
    runs = HeldRuns(lambda: None)
    queue = RunQueue(scheduler, QueuedBodies(), settle)
    policy = AdmissionPolicy(max_queued=max_queued, dry_run=dry_run,
                             allow_unverified=allow_unverified)
    admission = Admission(secret=SECRET, policy=policy, book=AccountBook(), runs=runs,
                          queue=queue, steps=None if dry_run else LedgerSteps(ledger),
                          take_on=take_on)
    return Parts(admission, ledger, runs, queue, scheduler, Acks(), taken_on, settled)


def body_of(run_id: str) -> str:
    return json.dumps({"run_id": run_id, "conversation_id": None, "text": "hello",
                       "completion_path": f"/v1/agent/runs/{run_id}/complete"})


async def deliver(parts: Parts, run_id: str, delivery_id: str = "d1", *,
                  secret: str = SECRET) -> tuple[int, str]:
    """Deliver ``run_id``'s body signed with ``secret``; the ack admission sent."""
    text, ts = body_of(run_id), int(time.time())
    delivery = Delivery(id=delivery_id, event="agent.run", timestamp=ts,
                        signature=sign(secret, ts, text), body=text)
    before = len(parts.session.sent)
    await parts.admission.answer(parts.session, delivery)  # type: ignore[arg-type]
    assert len(parts.session.sent) == before + 1
    ack = parts.session.sent[-1]
    assert isinstance(ack, Ack) and ack.id == delivery_id
    return ack.status, ack.reason


def in_ledger(parts: Parts, run_id: str, state: RunState = RunState.ACCEPTED) -> None:
    """Record ``run_id`` as a delivery whose ack was lost would have left it."""
    parts.ledger.admit(run_id, f"run:{run_id}", body_of(run_id), time.time())
    if state is RunState.REPORTED:
        parts.ledger.mark_reported(run_id, "posted", time.time())


async def test_a_new_run_is_recorded_held_and_queued_before_its_200(ledger: Ledger) -> None:
    parts = build(ledger)
    assert await deliver(parts, "r1") == (intake.ACCEPTED, "accepted")
    row = ledger.get("r1")
    assert row is not None and row.state is RunState.ACCEPTED and row.body == body_of("r1")
    assert list(parts.runs) == ["r1"] and "r1" in parts.scheduler
    assert parts.queue.queued() == 1 and parts.runs["r1"].state == "queued"
    assert parts.taken_on == [] and parts.settled == []


async def test_a_held_run_redelivered_is_answered_without_touching_the_ledger(
    ledger: Ledger,
) -> None:
    parts = build(ledger)
    await deliver(parts, "r1")
    counting = Wrapped(ledger)
    parts.admission.ledger = counting  # type: ignore[assignment]
    assert await deliver(parts, "r1", "d2") == (intake.ACCEPTED, "already accepted")
    assert counting.used == []
    assert parts.queue.queued() == 1 and parts.taken_on == []


async def test_while_draining_a_reported_run_gets_204_and_a_new_one_503(
    ledger: Ledger,
) -> None:
    parts = build(ledger)
    in_ledger(parts, "done", RunState.REPORTED)
    parts.queue.draining = True
    assert await deliver(parts, "done") == (intake.IGNORED, "already reported")
    assert await deliver(parts, "fresh", "d2") == (intake.DRAINING, intake.SHUTTING_DOWN)
    assert ledger.get("fresh") is None
    assert len(parts.runs) == 0 and parts.queue.queued() == 0 and parts.taken_on == []


async def test_a_full_queue_refuses_a_new_run_but_takes_on_one_the_ledger_has(
    ledger: Ledger,
) -> None:
    parts = build(ledger, max_queued=1)
    assert await deliver(parts, "first") == (intake.ACCEPTED, "accepted")
    assert await deliver(parts, "second", "d2") == (intake.DRAINING, intake.QUEUE_FULL)
    assert ledger.get("second") is None and "second" not in parts.runs
    in_ledger(parts, "lost_ack")
    assert await deliver(parts, "lost_ack", "d3") == (intake.ACCEPTED, "already accepted")
    assert parts.taken_on == ["lost_ack"]
    assert parts.queue.queued() == 1  # taking it on is take_on's job, not admission's


async def test_every_account_limited_refuses_a_new_run_with_the_reset_time(
    ledger: Ledger,
) -> None:
    parts = build(ledger)
    until = time.time() + 3600
    parts.admission.book.report("default", LimitNotice(state="limited", resets_at=until),
                                time.time())
    assert await deliver(parts, "r1") == (intake.DRAINING, all_limited_reason(until))
    assert ledger.get("r1") is None and len(parts.runs) == 0


async def test_a_ledger_that_cannot_record_refuses_an_unknown_run_and_answers_a_known_one(
    ledger: Ledger,
) -> None:
    parts = build(ledger)
    in_ledger(parts, "done", RunState.REPORTED)
    parts.admission.ledger = Wrapped(ledger, failing=("admit",))  # type: ignore[assignment]
    assert await deliver(parts, "fresh") == (intake.DRAINING, NOT_RECORDED)
    assert await deliver(parts, "done", "d2") == (intake.IGNORED, "already reported")
    assert ledger.get("fresh") is None and len(parts.runs) == 0


async def test_while_draining_a_ledger_that_cannot_be_read_gets_503_not_looked_up(
    ledger: Ledger,
) -> None:
    parts = build(ledger)
    await deliver(parts, "held")
    in_ledger(parts, "done", RunState.REPORTED)
    parts.queue.draining = True
    parts.admission.ledger = Wrapped(ledger, failing=("get",))  # type: ignore[assignment]
    assert await deliver(parts, "done", "d2") == (intake.DRAINING, NOT_LOOKED_UP)
    # A run held here is answered from memory, whatever the ledger says.
    assert await deliver(parts, "held", "d3") == (intake.ACCEPTED, "already accepted")


async def test_a_bad_signature_is_401_and_nothing_is_recorded(ledger: Ledger) -> None:
    parts = build(ledger)
    status, reason = await deliver(parts, "r1", secret="not-the-secret")
    assert status == intake.UNSIGNED and "signature" in reason
    assert ledger.get("r1") is None and len(parts.runs) == 0 and parts.queue.queued() == 0


async def test_allow_unverified_accepts_a_run_with_a_bad_signature(ledger: Ledger) -> None:
    parts = build(ledger, allow_unverified=True)
    assert await deliver(parts, "r1", secret="not-the-secret") == (intake.ACCEPTED,
                                                                   "accepted")
    assert ledger.get("r1") is not None and "r1" in parts.scheduler


async def test_a_dry_run_acks_without_ledger_or_queue_and_remembers_the_run(
    ledger: Ledger,
) -> None:
    parts = build(ledger, dry_run=True)
    assert await deliver(parts, "r1") == (intake.ACCEPTED, "accepted (dry run)")
    assert await deliver(parts, "r1", "d2") == (intake.ACCEPTED, "already accepted")
    parts.queue.draining = True
    assert await deliver(parts, "r1", "d3") == (intake.ACCEPTED, "already accepted")
    assert await deliver(parts, "r2", "d4") == (intake.DRAINING, intake.SHUTTING_DOWN)
    assert ledger.get("r1") is None and len(parts.runs) == 0 and parts.queue.queued() == 0
