"""Admission (prohost.engine.supervisor.admission, §3) built from only the parts it
uses: a real sqlite ledger, scheduler (never run: a queued run stays queued), run
queue, held-runs table and account book. Stand-ins: the session (collects the acks),
``take_on`` and ``settle`` (record). ``later`` starts its tasks in a nursery the test
owns, as the harness's starts them in its own. The unit-level counterpart of
tests/engine/supervisor/test_redelivery_never_503.py and
tests/engine/supervisor/test_admission_in_runs.py."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from prohost.engine.accounts.book import AccountBook
from prohost.engine.accounts.limits import LimitNotice
from prohost.engine.changes import Changes
from prohost.engine.ledger import Ledger, LedgerError, RunState
from prohost.engine.ledger.steps import LedgerSteps
from prohost.engine.run.queued_bodies import QueuedBodies
from prohost.engine.supervisor.admission import (
    NOT_LOOKED_UP,
    NOT_RECORDED,
    Admission,
    AdmissionPolicy,
    Intake,
)
from prohost.engine.supervisor.dryrun import DryRun
from prohost.engine.supervisor.held import HeldRuns
from prohost.engine.supervisor.runqueue import RunQueue
from prohost.wire import intake
from prohost.wire.outcomes import NOT_STARTED, all_limited_reason
from prohost.wire.protocol import Ack, Delivery, Message
from prohost.wire.runs import Outcome
from prohost.wire.signature import sign
from tests.kits.harness import wall_clock_bound
from tests.kits.lanes import SettleLog
from tests.kits.ledger import CommitHangs

pytestmark = pytest.mark.protocol("§3")

SECRET = "test-secret"
#: How long a test waits for a thread of the ledger (s): only a failure waits so long.
WAIT_S = 30.0


class Acks:
    """The session stand-in: every ack that goes out, in order — the one ``answer``
    returns, which the link's reader sends (:meth:`read`), and any sent on the
    session later."""

    def __init__(self) -> None:
        self.sent: list[Message] = []

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    async def read(self, admission: Intake, delivery: Delivery) -> None:
        """As the link's reader: hand ``delivery`` over, send what comes back."""
        ack = await admission.answer(self, delivery)  # type: ignore[arg-type]
        if ack is not None:
            await self.send(ack)


class Wrapped:
    """The ledger, recording which of its methods admission looks up; those named in
    ``failing`` raise LedgerError (a full disk, an unreadable file), and every call
    does ``meanwhile`` first (in the worker thread)."""

    def __init__(self, ledger: Ledger, *, failing: tuple[str, ...] = ()) -> None:
        self._ledger, self._failing = ledger, failing
        self.used: list[str] = []
        self.meanwhile: Callable[[], None] = lambda: None

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._ledger, name)
        if not callable(real) or name in ("stalled", "expect_admit", "withdraw_admits"):
            # A property (``serving``) or a look at memory (``stalled``, the admits
            # under way): no lookup.
            return real
        self.used.append(name)

        def call(*args: object, **kwargs: object) -> Any:
            self.meanwhile()
            if name in self._failing:
                raise LedgerError(f"{name} failed (test)")
            return real(*args, **kwargs)
        return call


class Later:
    """Admission's ``later`` as the harness builds it (``start_soon`` in its running
    nursery), in a nursery the test owns. :meth:`settled` waits until every task it
    started has returned: a take-on, which follows the ack, or an ack that waited
    for the disk."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.running = 0
        self._returned = Changes()

    def __call__(self, fn: Callable[[str], Awaitable[None]], arg: str) -> None:
        self.running += 1
        self.nursery.start_soon(self._run, fn, arg)

    async def _run(self, fn: Callable[[str], Awaitable[None]], arg: str) -> None:
        try:
            await fn(arg)
        finally:
            self.running -= 1
            self._returned.notify()

    async def settled(self) -> None:
        """Return once no task of ours runs. Cancelled: at once."""
        while self.running:
            await self._returned.wait()


@attrs.define
class Parts:
    admission: Any
    runs: HeldRuns
    queue: RunQueue
    session: Acks
    taken_on: list[str]
    scheduler: SettleLog
    later: Later

    @property
    def settled(self) -> list[tuple[str, Outcome]]:
        """The runs reported without executing, in order, and their outcomes."""
        return [(run_id, outcome) for run_id, outcome, *_ in self.scheduler.settled]


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    with Ledger.open(tmp_path / "ledger.sqlite3") as opened:
        yield opened


def build(ledger: Ledger, nursery: trio.Nursery, *, max_queued: int = 10,
          dry_run: bool = False, allow_unverified: bool = False) -> Parts:
    """Admission over real parts; its scheduler is never run, so nothing executes.
    What it does later (``later``) runs in ``nursery``."""
    taken_on: list[str] = []

    async def take_on(run_id: str) -> None:
        taken_on.append(run_id)

    scheduler = SettleLog()
    runs = HeldRuns(lambda: None)
    queue = RunQueue(scheduler, QueuedBodies(), lambda: None)
    policy = AdmissionPolicy(max_queued=max_queued, allow_unverified=allow_unverified)
    later = Later(nursery)
    # A dry run's part is chosen at the composition root in place of admission.
    admission: Intake = DryRun(secret=SECRET, policy=policy, queue=queue) if dry_run \
        else Admission(secret=SECRET, policy=policy, book=AccountBook(), runs=runs,
                       queue=queue, steps=LedgerSteps(ledger), take_on=take_on,
                       later=later)
    return Parts(admission, runs, queue, Acks(), taken_on, scheduler, later)


def body_of(run_id: str) -> str:
    return json.dumps({"run_id": run_id, "conversation_id": None, "text": "hello",
                       "completion_path": f"/v1/agent/runs/{run_id}/complete"})


def delivery_of(run_id: str, delivery_id: str = "d1", *, secret: str = SECRET) -> Delivery:
    """``run_id``'s delivery, its body signed with ``secret``."""
    text, ts = body_of(run_id), int(time.time())
    return Delivery(id=delivery_id, event="agent.run", timestamp=ts,
                    signature=sign(secret, ts, text), body=text)


async def deliver(parts: Parts, run_id: str, delivery_id: str = "d1", *,
                  secret: str = SECRET) -> tuple[int, str]:
    """Deliver ``run_id``'s body signed with ``secret``; the ack admission sent,
    once what it started for the delivery (``later``) has returned too."""
    before = len(parts.session.sent)
    await parts.session.read(parts.admission,
                             delivery_of(run_id, delivery_id, secret=secret))
    await parts.later.settled()
    assert len(parts.session.sent) == before + 1
    ack = parts.session.sent[-1]
    assert isinstance(ack, Ack) and ack.id == delivery_id
    return ack.status, ack.reason


def in_ledger(ledger: Ledger, run_id: str, state: RunState = RunState.ACCEPTED) -> None:
    """Record ``run_id`` as a delivery whose ack was lost would have left it."""
    ledger.admit(run_id, f"run:{run_id}", body_of(run_id), time.time())
    if state is RunState.REPORTED:
        ledger.mark_reported(run_id, "posted", time.time())


def refuse_new_work(parts: Parts, state: str) -> str:
    """Put admission in ``state``; the 503 reason a new run then gets."""
    if state == "draining":
        parts.queue.draining = True
        return intake.SHUTTING_DOWN
    if state == "limited":
        until = time.time() + 3600
        parts.admission.book.report("default", LimitNotice(state="limited", resets_at=until),
                                    time.time())
        return all_limited_reason(until)
    assert parts.queue.queued() >= parts.admission.policy.max_queued
    return intake.QUEUE_FULL


async def test_a_new_run_is_recorded_held_and_queued_before_its_200(
    ledger: Ledger, nursery: trio.Nursery,
) -> None:
    parts = build(ledger, nursery)
    assert await deliver(parts, "r1") == (intake.ACCEPTED, "accepted")
    row = ledger.get("r1")
    assert row is not None and row.state is RunState.ACCEPTED and row.body == body_of("r1")
    assert list(parts.runs) == ["r1"] and "r1" in parts.queue.scheduler
    assert parts.queue.queued() == 1 and parts.runs["r1"].state == "queued"
    assert parts.taken_on == [] and parts.settled == []


async def test_a_held_run_redelivered_is_answered_without_touching_the_ledger(
    ledger: Ledger, nursery: trio.Nursery,
) -> None:
    parts = build(ledger, nursery)
    await deliver(parts, "r1")
    counting = Wrapped(ledger)
    parts.admission.steps = LedgerSteps(counting)  # type: ignore[arg-type]
    assert await deliver(parts, "r1", "d2") == (intake.ACCEPTED, "already accepted")
    assert counting.used == [] and parts.queue.queued() == 1 and parts.taken_on == []


@pytest.mark.protocol("§9")
async def test_a_drain_that_begins_during_the_ledger_write_reports_the_run_not_started(
    ledger: Ledger, nursery: trio.Nursery,
) -> None:
    parts = build(ledger, nursery)
    wrapped = Wrapped(ledger)
    wrapped.meanwhile = lambda: setattr(parts.queue, "draining", True)
    parts.admission.steps = LedgerSteps(wrapped)  # type: ignore[arg-type]
    assert await deliver(parts, "r1") == (intake.ACCEPTED, "accepted")
    assert wrapped.used == ["admit"] and "r1" in parts.runs
    assert parts.queue.queued() == 0
    assert parts.settled == [("r1", Outcome.failure(NOT_STARTED, retryable=True))]


async def test_the_ledgers_admit_answers_for_a_run_it_has_that_nothing_here_holds(
    ledger: Ledger, nursery: trio.Nursery,
) -> None:
    parts = build(ledger, nursery)
    in_ledger(ledger, "done", RunState.REPORTED)
    in_ledger(ledger, "lost_ack")
    assert await deliver(parts, "done") == (intake.IGNORED, "already reported")
    assert await deliver(parts, "lost_ack", "d2") == (intake.ACCEPTED, "already accepted")
    assert parts.taken_on == ["lost_ack"]
    assert len(parts.runs) == 0 and parts.queue.queued() == 0  # take_on's job, not ours


@pytest.mark.protocol("§9", "§12")
@pytest.mark.parametrize("state", ["draining", "limited", "queue full"])
async def test_while_new_work_is_refused_the_ledger_still_answers_for_its_runs(
    ledger: Ledger, nursery: trio.Nursery, state: str,
) -> None:
    parts = build(ledger, nursery, max_queued=1)
    assert await deliver(parts, "first") == (intake.ACCEPTED, "accepted")
    in_ledger(ledger, "done", RunState.REPORTED)
    in_ledger(ledger, "lost_ack")
    refusal = refuse_new_work(parts, state)
    assert await deliver(parts, "fresh", "d2") == (intake.DRAINING, refusal)
    assert await deliver(parts, "done", "d3") == (intake.IGNORED, "already reported")
    assert await deliver(parts, "lost_ack", "d4") == (intake.ACCEPTED, "already accepted")
    assert await deliver(parts, "first", "d5") == (intake.ACCEPTED, "already accepted")
    assert ledger.get("fresh") is None and list(parts.runs) == ["first"]
    assert parts.taken_on == ["lost_ack"] and parts.queue.queued() == 1


async def test_a_ledger_that_cannot_record_refuses_an_unknown_run_and_answers_a_known_one(
    ledger: Ledger, nursery: trio.Nursery,
) -> None:
    parts = build(ledger, nursery)
    in_ledger(ledger, "done", RunState.REPORTED)
    parts.admission.steps = LedgerSteps(Wrapped(ledger, failing=("admit",)))  # type: ignore[arg-type]
    assert await deliver(parts, "fresh") == (intake.DRAINING, NOT_RECORDED)
    assert await deliver(parts, "done", "d2") == (intake.IGNORED, "already reported")
    assert ledger.get("fresh") is None and len(parts.runs) == 0


@pytest.mark.protocol("§9")
async def test_while_draining_a_ledger_that_cannot_be_read_gets_503_not_looked_up(
    ledger: Ledger, nursery: trio.Nursery,
) -> None:
    parts = build(ledger, nursery)
    await deliver(parts, "held")
    in_ledger(ledger, "done", RunState.REPORTED)
    parts.queue.draining = True
    # Admission reads the last commit (issue 27, point 6): that read fails.
    parts.admission.steps = LedgerSteps(Wrapped(ledger, failing=("committed",)))  # type: ignore[arg-type]
    assert await deliver(parts, "done", "d2") == (intake.DRAINING, NOT_LOOKED_UP)
    # A run held here is answered from memory, whatever the ledger says.
    assert await deliver(parts, "held", "d3") == (intake.ACCEPTED, "already accepted")


async def test_a_bad_signature_is_401_unless_unverified_runs_are_allowed(
    ledger: Ledger, nursery: trio.Nursery,
) -> None:
    parts = build(ledger, nursery)
    status, reason = await deliver(parts, "r1", secret="not-the-secret")
    assert status == intake.UNSIGNED and "signature" in reason
    assert ledger.get("r1") is None and len(parts.runs) == 0 and parts.queue.queued() == 0
    lenient = build(ledger, nursery, allow_unverified=True)
    assert await deliver(lenient, "r1", secret="wrong") == (intake.ACCEPTED, "accepted")
    assert ledger.get("r1") is not None and "r1" in lenient.queue.scheduler


async def test_a_dry_run_acks_without_ledger_or_queue_and_remembers_the_run(
    ledger: Ledger, nursery: trio.Nursery,
) -> None:
    parts = build(ledger, nursery, dry_run=True)
    assert await deliver(parts, "r1") == (intake.ACCEPTED, "accepted (dry run)")
    assert await deliver(parts, "r1", "d2") == (intake.ACCEPTED, "already accepted")
    parts.queue.draining = True
    assert await deliver(parts, "r1", "d3") == (intake.ACCEPTED, "already accepted")
    assert await deliver(parts, "r2", "d4") == (intake.DRAINING, intake.SHUTTING_DOWN)
    assert ledger.get("r1") is None and len(parts.runs) == 0 and parts.queue.queued() == 0


async def test_an_ack_that_waits_for_the_disk_is_sent_from_a_later_task(
    tmp_path: Path, nursery: trio.Nursery, mock_clock: trio.testing.MockClock,
) -> None:
    """The ``accepted`` write outlives its bound inside its transaction: neither 200
    nor 503 is true yet, so ``answer`` returns with no ack (the reader goes on), and
    the ack is sent from a task of ``later`` once the disk has answered."""
    # The clock stands still but for the jump past the bound: a regression that
    # keeps the ack from coming fails on real time instead of hanging.
    async with wall_clock_bound(60):
        with CommitHangs.open(tmp_path / "ledger.sqlite3") as hung:
            assert isinstance(hung, CommitHangs)
            parts = build(hung, nursery)
            answered = trio.Event()

            async def reader() -> None:
                await parts.session.read(parts.admission, delivery_of("r1"))
                answered.set()

            nursery.start_soon(reader)
            await trio.to_thread.run_sync(hung.holding.wait, WAIT_S)
            mock_clock.autojump_threshold = 0  # past the write's bound, at once
            await answered.wait()
            mock_clock.autojump_threshold = float("inf")
            assert parts.session.sent == [] and parts.later.running == 1
            assert "r1" not in parts.runs and parts.taken_on == []
            hung.release.set()  # the disk answers: the row lands
            await parts.later.settled()
            assert parts.session.sent == [Ack(id="d1", status=intake.ACCEPTED,
                                              reason="already accepted")]
            row = hung.get("r1")
            assert row is not None and row.state is RunState.ACCEPTED
            # Held by nobody here: taken on after its ack, as any run the ledger has.
            assert parts.taken_on == ["r1"]
