"""Admission (§3): from one delivery to its ack, with the run held and queued.

::

    intake.classify ─ held here? ─ new work refused? ─┬─ no:  steps.admit ─ hold ─ queue ─ ack
                                                      └─ yes: ledger read ─ 200/204, else 503

The decision about the frame itself (size, signature, body) is pure and lives in
:mod:`prohost.wire.intake`; it also says which 503 a *new* run would get (draining,
every account limited). This module adds what needs the supervisor's state: the
answer for a run the harness already holds or has reported, which outranks every
503 (a run sent elsewhere while it runs here runs twice), the queue cap, the
ledger write that must come before the 200, and the hand-over to the scheduler.

Costs: a run held in memory is answered without touching the ledger; a new run in
the normal state costs the one worker-thread hop of ``ledger.admit``, which also
answers for a run the ledger knows; only while new work is refused does a
delivery cost a ledger read, so that its 503 is never sent for a run the ledger
holds or has reported. A run is acked 200 only once the ledger holds it, so a
crash after the ack never loses it (§7); a crash before the ack means the server
redelivers, and the ledger answers "already accepted".
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable

import attrs
import trio
import trio_websocket

from prohost.engine import lognames
from prohost.engine.accounts.book import AccountBook
from prohost.engine.blocking import StepTimedOut
from prohost.engine.ledger import Admitted, AdmitTicket, LedgerError, RunState
from prohost.engine.ledger.interfaces import AdmissionSteps
from prohost.engine.link.connection import Session
from prohost.engine.run.heldrun import HeldRun
from prohost.engine.supervisor.held import HeldRuns
from prohost.engine.supervisor.runqueue import RunQueue
from prohost.wire import intake
from prohost.wire.outcomes import all_limited_reason
from prohost.wire.protocol import Ack, Delivery
from prohost.wire.runs import AgentRun

log = logging.getLogger(lognames.HARNESS)
progress_log = logging.getLogger(lognames.RUNS)

#: The 503 reason when the ledger cannot record a new run.
NOT_RECORDED = "the agent could not record the run; try again later"
#: The 503 reason when the ledger cannot say whether it knows a run (§3: only then
#: may a run the harness might know be refused).
NOT_LOOKED_UP = "the agent could not read its run ledger; try again later"


class AckLater(Exception):
    """No ack can be sent for the delivery yet: an ``accepted`` write of its run is
    under way and may still land, so neither 200 (it may fail) nor 503 (it may
    land, and the run would run here and elsewhere) is true yet (issue 27, point 3).
    ``answer`` waits for the disk and returns the ack then."""

    def __init__(self, answer: Callable[[], Awaitable[tuple[int, str]]]) -> None:
        super().__init__("the ack waits for a ledger write under way")
        self.answer = answer


@attrs.frozen
class AdmissionPolicy:
    """The flags that decide about a delivery (``agent run``'s options)."""

    #: --max-queued: past it a new run gets 503 (§3).
    max_queued: int
    #: --allow-unverified: a missing or wrong signature is logged, not refused.
    allow_unverified: bool = False


class Intake:
    """From one delivery to its ack (§3): the frame's verdict
    (:func:`prohost.wire.intake.classify`), then :meth:`admit` for a run that
    passed. Two kinds, chosen by the composition root: :class:`Admission` (the
    ledger's) and :class:`prohost.engine.supervisor.dryrun.DryRun` (``--dry-run``).
    """

    def __init__(self, *, secret: str, policy: AdmissionPolicy, queue: RunQueue) -> None:
        self.secret = secret
        self.policy = policy
        self.queue = queue

    async def answer(self, session: Session, delivery: Delivery) -> Ack | None:
        """Decide about one delivery; return its ack, which the link's reader sends
        (once the ledger holds a run acked 200, §3), or ``None`` when the ack cannot
        be known yet and is sent on ``session`` later (:meth:`ack_later`). Never
        raises for what the server sent.

        Cancelled (the connection dropped): as :meth:`admit`; no ack is sent.
        """
        now = time.time()
        verdict = intake.classify(
            delivery,
            secret=self.secret,
            now=now,
            draining=self.queue.draining,
            allow_unverified=self.policy.allow_unverified,
            unavailable=self.unavailable(now),
        )
        run = verdict.run
        if run is None:
            log.warning("delivery %s refused with %d: %s", intake.shown(delivery.id),
                        verdict.status, verdict.reason)
            return Ack(id=delivery.id, status=verdict.status, reason=verdict.reason)
        if verdict.unverified:
            log.warning("accepted run %s without a valid signature (%s) because of "
                        "--allow-unverified", run.run_id, verdict.unverified)
        try:
            status, reason = await self.admit(run, verdict.body, refusal=verdict.refusal)
        except AckLater as later:
            self.ack_later(session, delivery.id, later.answer)
            return None
        return Ack(id=delivery.id, status=status, reason=reason)

    def ack_later(self, session: Session, delivery_id: str,
                  answer: Callable[[], Awaitable[tuple[int, str]]]) -> None:
        """Have the ack ``answer`` returns sent once it can be known, without
        waiting for it here (the reader goes on). Only an intake whose
        :meth:`admit` raises :class:`AckLater` has one (:class:`Admission`;
        ``DryRun`` writes nothing, so it never waits for a disk)."""
        raise NotImplementedError

    def unavailable(self, now: float) -> str | None:
        """Why no new run can be taken now beside a drain (§12), if so."""
        return None

    async def admit(self, run: AgentRun, body: str, *,
                    refusal: str | None = None) -> tuple[int, str]:
        """The ack (status, reason) for one classified run. Cancelled: the run is
        not held."""
        raise NotImplementedError


class Admission(Intake):
    """Answers deliveries: held runs from memory, the rest from the ledger (§3).

    Handed only what it uses: the signing secret, its policy, the account book (a
    run no account can take gets 503, §12), the table of held runs, the run queue,
    the ledger steps, and ``take_on``, which holds again a run the ledger has
    unreported and nothing here holds (the recovery's ``resume_unheld``).
    """

    def __init__(self, *, secret: str, policy: AdmissionPolicy, book: AccountBook,
                 runs: HeldRuns, queue: RunQueue, steps: AdmissionSteps,
                 take_on: Callable[[str], Awaitable[None]],
                 later: Callable[[Callable[[str], Awaitable[None]], str], None],
                 ) -> None:
        super().__init__(secret=secret, policy=policy, queue=queue)
        self.book = book
        self.runs = runs
        self.steps = steps
        self.take_on = take_on
        #: Starts a task in the harness's nursery (``later(fn, arg)``): what would
        #: hold the reader behind a write is done there — a take-on, after the ack;
        #: an ack that waits for the disk (:class:`AckLater`).
        self.later = later
        #: Runs already refused (and logged) during this drain; a drain ends the process.
        self._refused_draining: set[str] = set()

    def unavailable(self, now: float) -> str | None:
        """No account can take a new run: the server had better send it elsewhere
        (§12)."""
        book = self.book
        return all_limited_reason(book.earliest_reset(now)) if book.all_limited(now) else None

    async def admit(self, run: AgentRun, body: str, *,
                    refusal: str | None = None) -> tuple[int, str]:
        """Answer for one classified run, recording, holding and queueing it when new;
        return the ack's status and reason.

        ``refusal`` is the 503 reason that applies to a new run (draining, every
        account limited: :attr:`prohost.wire.intake.Verdict.refusal`); a full queue
        adds its own. It is applied only once the ledger has said it does not know
        the run: a run held or reported here gets 200 or 204 in every state (§3).

        Cancelled: as the bounded ledger call; the run is then recorded or not, but
        not held, and its redelivery takes it on from the ledger (``take_on``).
        """
        steps = self.steps
        if run.run_id in self.runs:
            # Queued, waiting for an account, running or being reported: the ledger
            # has it, and saying so costs no worker-thread hop.
            return intake.ACCEPTED, "already accepted"
        why = refusal
        max_queued = self.policy.max_queued
        if refusal is None and self.queue.queued() >= max_queued:
            refusal, why = intake.QUEUE_FULL, f"{max_queued} runs are already queued"
        if refusal is not None:
            return await self._known_or_refused(run, refusal, unreadable=NOT_LOOKED_UP,
                                                why=why)
        if steps.stalled():
            # A write hangs (or crawls): ours would queue behind it for up to its
            # bound. A run the ledger has reported is answered 204 from the last
            # commit, at once (issue 27, point 6); any other run still needs the
            # write's answer.
            try:
                row = await steps.known(run.run_id)
            except (LedgerError, OSError):
                row = None
            if row is not None:
                # Unreported: held here in the last commit, so 200 whatever is
                # queued behind it (taken on once the disk answers, see _known).
                return self._known(run.run_id, row.state is RunState.REPORTED)
        try:
            # Abandoning on a hung disk is safe: one transaction under the ledger's
            # lock (prohost.engine.ledger); past its bound the write is withdrawn
            # if it was not applied, or else the ack waits for it
            # (_known_or_refused), so a 503 below means "not recorded", for good,
            # and the server may send the run elsewhere (issue 27, point 3).
            admitted = await steps.admit(run.run_id, run.lane, body)
        except StepTimedOut as exc:
            # A hung write. The read does not queue behind it (the read connection
            # sees the last commit): a run already reported is still 204, one the
            # ledger holds 200, and only a run it does not know gets the 503.
            log.error("could not record run %s in the ledger: %s", run.run_id, exc)
            return await self._known_or_refused(run, NOT_RECORDED, unreadable=NOT_RECORDED)
        except (LedgerError, OSError) as exc:
            log.error("could not record run %s in the ledger: %s", run.run_id, exc)
            # A full or read-only disk may still be read: a run the ledger already
            # has is answered from it rather than refused.
            return await self._known_or_refused(run, NOT_RECORDED, unreadable=NOT_RECORDED)
        if admitted is not Admitted.NEW:
            return self._known(run.run_id, admitted is Admitted.REPORTED)
        held = HeldRun.of(run)
        self.runs.hold(held)
        # A drain that began while the ledger was written makes it "not started": the
        # run is ours now, so it is reported rather than lost (RunQueue.put).
        if self.queue.put(held, body):
            progress_log.info("accepted run %s on %s", held.run_id, held.lane)
        return intake.ACCEPTED, "accepted"

    def ack_later(self, session: Session, delivery_id: str,
                  answer: Callable[[], Awaitable[tuple[int, str]]]) -> None:
        """The ack, once the disk has said whether the run's ``accepted`` write
        landed, sent from a task of the harness (``later``) so that the reader
        answers other deliveries (and pings) meanwhile. That task cancelled: no
        ack is sent (the server redelivers, and the redelivery is answered from
        the ledger, or waits likewise)."""

        async def send(_: str) -> None:
            status, reason = await answer()
            try:
                await session.send(Ack(id=delivery_id, status=status, reason=reason))
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError,
                    trio_websocket.ConnectionClosed) as exc:
                # The connection dropped meanwhile: the server redelivers.
                log.warning("delivery %s: its ack (%d) could not be sent (%s); the "
                            "server sends it again", intake.shown(delivery_id), status, exc)

        self.later(send, delivery_id)

    async def _known_or_refused(self, run: AgentRun, refusal: str, *,
                                unreadable: str, why: str | None = None) -> tuple[int, str]:
        """While new work is refused: the ledger's answer for a run it knows, else the
        503 ``refusal`` (logged with ``why``, if given); ``unreadable`` (a 503 too)
        when the ledger cannot be read.

        Raises :class:`AckLater` while an ``accepted`` write of the run is under way:
        its row may still land, so no answer is true yet (issue 27, point 3).

        Cancelled: as :meth:`LedgerSteps.known` (a read: nothing is left half done).
        """
        # A 503 means "not recorded", for good: every accepted write of the run not
        # applied yet is withdrawn first (it will insert nothing, so no crash can
        # bring its row back), and while one is inserting its row in a transaction
        # the disk has not settled, the answer waits for the disk (whatever it
        # says then, the last commit below is final for this run). Withdrawn, or
        # a delete queued behind such a row, would not do: a kill -9 between that
        # row's commit and the delete's leaves a run answered 503 for the next
        # start to run.
        under_way = self.steps.under_way(run.run_id)
        if under_way:
            log.warning("run %s: its ledger write is still under way (a slow or hung "
                        "disk?); its delivery is answered once the disk has said "
                        "whether it was recorded", run.run_id)
            raise AckLater(functools.partial(self._once_settled, run, under_way, refusal,
                                             unreadable=unreadable, why=why))
        # What is committed is enough here, so the read never waits behind a queued
        # or hung write (issue 27, point 6): every ``accepted`` write of this run
        # still queued was just withdrawn, and none is under way, so the last
        # commit is final for this run: "not known" there is the truth, for good.
        # Every run acked 200 before is held in memory (answered above, without the
        # ledger) or has its ``accepted`` row committed (the 200 waits for it). So
        # a committed ``reported`` is 204 and no committed row is 503, at once.
        # Only a row committed unreported for a run no longer held may be behind
        # its queued (non-durable) ``reported``. That one rare case is not asked
        # again, so that no answer waits behind a write: 200 at once (never 503
        # for it; 200 and 204 both stop the server redelivering, and it is not
        # run again), and the take-on, which reads after what is queued (and so
        # sees such a ``reported``), follows the ack (_known).
        try:
            row = await self.steps.known(run.run_id)
        except (LedgerError, OSError) as exc:
            log.error("run %s refused with 503: the ledger could not be read (%s)",
                      run.run_id, exc)
            return intake.DRAINING, unreadable
        if row is not None:
            return self._known(run.run_id, row.state is RunState.REPORTED)
        if refusal == intake.SHUTTING_DOWN:
            # The server offers a refused run again within seconds, over and over
            # while the drain lasts: the first refusal is news, the rest are not.
            first = run.run_id not in self._refused_draining
            self._refused_draining.add(run.run_id)
            (log.info if first else log.debug)(
                "run %s refused with 503: %s%s", run.run_id, why or refusal,
                " (the server will offer it elsewhere; its further offers are not logged)"
                if first else "")
            return intake.DRAINING, refusal
        # scripts/soak.py counts "refused with 503: every account …" and "… already queued".
        log.warning("run %s refused with 503: %s", run.run_id, why or refusal)
        return intake.DRAINING, refusal

    async def _once_settled(self, run: AgentRun, under_way: list[AdmitTicket],
                            refusal: str, *, unreadable: str,
                            why: str | None) -> tuple[int, str]:
        """:meth:`_known_or_refused` once the disk has settled ``under_way`` (and any
        write of the run found under way then). Cancelled: nothing is answered."""
        while True:
            await self.steps.settled(under_way)
            try:
                return await self._known_or_refused(run, refusal, unreadable=unreadable,
                                                    why=why)
            except AckLater:
                # Another delivery's write of the run got under way meanwhile.
                under_way = self.steps.under_way(run.run_id)

    def _known(self, run_id: str, reported: bool) -> tuple[int, str]:
        """The ack for a run the ledger has: 204 once reported, else 200, taking it on
        if nothing here holds it (a delivery whose ack never went out, or a report
        that failed) rather than leaving it for the next start. The take-on, which
        waits for what is queued (a hung write would hold it), is a task of the
        harness (``later``) started here, so it follows the ack."""
        if reported:
            return intake.IGNORED, "already reported"
        if run_id not in self.runs:
            # Taking it on reads the row after what is queued (a queued
            # ``reported`` must not be missed), which a hung write would hold: the
            # ack goes now, and the run is taken on after it — at once, or once
            # the disk answers (issue 27, point 6).
            self.later(self._take_on_later, run_id)
        return intake.ACCEPTED, "already accepted"

    async def _take_on_later(self, run_id: str) -> None:
        """``take_on`` after the ack, in the harness's nursery: a failure is logged
        (the ledger holds the run all the same; its next redelivery or start takes
        it on). Cancelled: as ``take_on``."""
        try:
            await self.take_on(run_id)
        except (LedgerError, OSError) as exc:
            log.error("run %s: could not take it on from the ledger (%s); its next "
                      "redelivery or start does", run_id, exc)
