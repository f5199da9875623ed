"""Admission (§3): from one delivery to its ack, with the run held and queued.

::

    intake.classify ─ (dry run) ─ queue cap ─ ledger.admit ─ hold ─ scheduler.submit ─ ack

The decision about the frame itself (signature, body, draining, limited accounts) is
pure and lives in :mod:`prohost.wire.intake`; this module adds what needs the
supervisor's state: the ledger write that must come before the 200, the queue cap,
and the hand-over to the scheduler. A run is acked 200 only once the ledger holds
it, so a crash after the ack never loses it (§7); a crash before the ack means the
server redelivers, and the ledger answers "already accepted".
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from prohost.engine.accountgate import all_limited_reason
from prohost.engine.heldrun import HeldRun
from prohost.engine.ledger import Admission, LedgerError
from prohost.engine.link import Session
from prohost.engine.recovery import queue, resume_unheld
from prohost.engine.runner import progress_log
from prohost.wire import intake
from prohost.wire.protocol import Ack, Delivery
from prohost.wire.runs import AgentRun

if TYPE_CHECKING:
    from prohost.engine.harness import Harness

log = logging.getLogger("prohost.harness")


async def answer_delivery(harness: Harness, session: Session, delivery: Delivery) -> None:
    """Decide about one delivery and send its ack; never raises for what the server sent.

    Cancelled (the connection dropped): a run may be left recorded in the ledger
    but unacked; its redelivery is then answered 200 "already accepted".
    """
    now = time.time()
    book = harness.book
    verdict = intake.classify(
        delivery,
        secret=harness.endpoints.secret,
        now=now,
        draining=harness.draining,
        allow_unverified=harness.options.allow_unverified,
        # No account can take it: the server had better send it elsewhere (§12).
        unavailable=all_limited_reason(book.earliest_reset(now))
        if not harness.options.dry_run and book.all_limited(now) else None,
    )
    run = verdict.run
    if run is None:
        log.warning("delivery %s refused with %d: %s", intake.shown(delivery.id),
                    verdict.status, verdict.reason)
        await session.send(Ack(id=delivery.id, status=verdict.status, reason=verdict.reason))
        return
    if verdict.unverified:
        log.warning("accepted run %s without a valid signature (%s) because of "
                    "--allow-unverified", run.run_id, verdict.unverified)
    status, reason = await admit(harness, run, verdict.body)
    await session.send(Ack(id=delivery.id, status=status, reason=reason))


async def admit(harness: Harness, run: AgentRun, body: str) -> tuple[int, str]:
    """Record, hold and queue one classified run; return the ack's status and reason.

    Cancelled: as the bounded ledger write; the run is then recorded or not, but
    not held, and its redelivery takes it on from the ledger
    (:func:`prohost.engine.recovery.resume_unheld`).
    """
    options = harness.options
    if options.dry_run:
        if run.run_id in harness.dry_seen:
            return intake.ACCEPTED, "already accepted"
        harness.dry_seen.add(run.run_id)
        log.info("dry run: would run %s on %s: %r", run.run_id, run.lane, run.text[:80])
        return intake.ACCEPTED, "accepted (dry run)"
    ledger = harness.ledger
    if ledger is None:
        raise RuntimeError("a harness without a ledger can only admit runs in a dry run")
    if (
        run.run_id not in harness.held
        and harness.scheduler.statistics().queued >= options.max_queued
    ):
        # A run already held is answered 200 below; only new work is refused.
        log.warning("refused run %s with 503: %d runs are already queued", run.run_id,
                    options.max_queued)
        return intake.DRAINING, intake.QUEUE_FULL
    try:
        # Abandoning on a hung disk is safe: one transaction under the ledger's
        # lock (prohost.engine.ledger); the delivery is then refused, and redelivered.
        admission = await harness.bounded(
            ledger.admit, run.run_id, run.lane, body, time.time(),
            what=f"recording run {run.run_id} in the ledger",
        )
    except (LedgerError, OSError) as exc:
        log.error("could not record run %s in the ledger: %s", run.run_id, exc)
        return intake.DRAINING, "the agent could not record the run; try again later"
    if admission is Admission.REPORTED:
        return intake.IGNORED, "already reported"
    if admission is Admission.HELD:
        if run.run_id not in harness.held:
            # Recorded by a delivery whose ack never went out, or left by a failed
            # report: acked as before, and taken on now rather than at the next start.
            await resume_unheld(harness, run.run_id)
        return intake.ACCEPTED, "already accepted"
    held = HeldRun.of(run)
    harness.hold(held)
    # A drain that began while the ledger was written makes it "not started": the
    # run is ours now, so it is reported rather than lost (recovery.queue).
    if queue(harness, held, body):
        progress_log.info("accepted run %s on %s", held.run_id, held.lane)
    return intake.ACCEPTED, "accepted"
