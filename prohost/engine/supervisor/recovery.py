"""Restart recovery (§7) and the end-of-drain sweep: the ledger's unreported rows
become held runs again, reported or queued as the protocol says. Queueing an
accepted run (:func:`queue`) is shared with admission, and a redelivered run that
nothing holds is taken on here too (:func:`resume_unheld`).

These are the supervisor's (:class:`prohost.engine.harness.Harness`) steps that read the
ledger of a previous process (or of this one, once a drain has ended); they log
under ``prohost.engine.harness``, the name users already filter on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from typing import TYPE_CHECKING

import trio

from prohost.engine.accounts.gate import iso_time
from prohost.engine.agent.procinfo import groups_of_run, process_belongs_to_run
from prohost.engine.blocking import StepTimedOut
from prohost.engine.lanes.scheduler import QueueFullError
from prohost.engine.ledger import LedgerRow, RunState
from prohost.engine.run.heldrun import HeldRun
from prohost.engine.supervisor.upkeep import prune
from prohost.engine.view.statustext import human_ago
from prohost.wire.runs import BodyError, Outcome, parse_body

if TYPE_CHECKING:
    from prohost.engine.harness import Harness

log = logging.getLogger("prohost.harness")

NOT_STARTED = "the agent is shutting down; the run was not started"
QUEUE_FULL = "the agent's queue is full; the run was not started"
INTERRUPTED = "the harness lost track of this run before it finished"
RESTARTED = "the harness restarted before this run finished"


async def recover(harness: Harness) -> None:
    """Pick up where a previous process left off (§7).

    A drain that comes meanwhile (a signal while the ledger is read) turns the
    runs accepted before the restart into "not started" reports (§9) instead of
    queueing them. Cancelled: the runs not held yet stay in the ledger as they
    were, for the next start.
    """
    if harness.ledger is None:
        return
    # Abandoning these on a hung disk is safe: reads and single transactions under
    # the ledger's lock, and /proc reads (prohost.engine.ledger, prohost.engine.blocking). A hung
    # read fails the start with the StepTimedOut; restart once the disk answers.
    recovery = await harness.bounded(harness.ledger.recover, what="reading the ledger at start")
    limits = await harness.bounded(harness.ledger.account_limits,
                                 what="reading the accounts' limits at start")
    now = time.time()
    for name, until in limits.items():
        harness.book.restore(name, until, now)
        if until > now and name in {a.name for a in harness.book.accounts}:
            log.warning("account %s is at its usage limit until %s (remembered from "
                        "before the restart)", name, iso_time(until))
    for row in recovery.interrupted:
        held = await held_from(harness, row)
        if held is None:
            continue
        try:
            await harness.bounded(kill_leftover, row,
                                what=f"looking for run {row.run_id}'s leftover agent")
        except StepTimedOut as exc:
            log.warning("%s", exc)
        log.warning("run %s was running when the harness stopped; reporting it", row.run_id)
        carry_on(harness, held, row, interrupted=RESTARTED)
    for row in recovery.outbox:
        held = await held_from(harness, row)
        if held is None or row.outcome is None:
            continue
        log.info("run %s finished before the restart; reporting it now", row.run_id)
        carry_on(harness, held, row)
    for row in recovery.pending:
        held = await held_from(harness, row)
        if held is None:
            continue
        log.info("run %s was accepted before the restart; %s", row.run_id,
                 "not starting it, the harness is draining" if harness.draining
                 else "queueing it again")
        carry_on(harness, held, row)
    pruned = await prune(harness)
    if pruned:
        log.debug("pruned %d old ledger rows", pruned)


async def held_from(harness: Harness, row: LedgerRow) -> HeldRun | None:
    """The run of a ledger row, held again; ``None`` (the row closed, logged) when its
    body cannot be read any more.

    Cancelled: as :meth:`prohost.engine.blocking.Bounds.run` (closing the row).
    """
    try:
        return HeldRun.of(parse_body(row.body))
    except BodyError as exc:  # accepted by an older version that was less strict
        await _close_unreadable(harness, row.run_id, exc)
        return None


async def _close_unreadable(harness: Harness, run_id: str, exc: BodyError) -> None:
    """Close a row whose body cannot be parsed, so that it is not met again at every
    start. Cancelled: as :meth:`prohost.engine.blocking.Bounds.run`."""
    log.error("run %s in the ledger cannot be read (%s); closing it unreported", run_id, exc)
    if harness.ledger is None:
        return
    await harness.bounded(
        harness.ledger.mark_reported, run_id, f"unreadable: {exc}", time.time(),
        what=f"closing unreadable run {run_id}",
    )


def carry_on(harness: Harness, held: HeldRun, row: LedgerRow, *,
             interrupted: str = INTERRUPTED) -> None:
    """Hold a ledger row's run again and take it on from where the ledger has it:
    a saved outcome is reported as it is, an accepted run is queued (or, during a
    drain, reported not started), and a run that had started is reported with
    ``interrupted`` (retryable), since nothing in this process is running it."""
    harness.hold(held)
    if row.state is RunState.FINISHED and row.outcome is not None:
        harness.settle_soon(held, Outcome.from_json(row.outcome), recorded=True,
                            finished_at=row.finished_at)
    elif row.state is not RunState.ACCEPTED:
        harness.settle_soon(held, Outcome.failure(interrupted, retryable=True))
    else:
        queue(harness, held, row.body)


def queue(harness: Harness, held: HeldRun, body: str) -> bool:
    """Queue an accepted, held run, light (its parsed body dropped, ``body`` kept
    within the budget: :mod:`prohost.engine.run.queued_bodies`); True once queued.

    During a drain it is reported "not started" instead (§9), and past the
    scheduler's cap "queue full" (both retryable): it is held, so it is reported
    rather than lost.
    """
    if harness.draining:
        harness.settle_soon(held, Outcome.failure(NOT_STARTED, retryable=True))
        return False
    parsed = held.body
    harness.bodies.keep(held, body)
    try:
        harness.scheduler.submit(held.run_id, held.lane, held)
    except QueueFullError as exc:
        # Admission answers 503 before the scheduler's cap is reached, so only a
        # ledger holding more than the cap at start (an older version's rows) gets here.
        log.error("%s", exc)
        harness.bodies.drop(held)
        held.body = parsed
        harness.settle_soon(held, Outcome.failure(QUEUE_FULL, retryable=True))
        return False
    return True


async def resume_unheld(harness: Harness, run_id: str) -> None:
    """Take on a run the ledger has unreported while nothing in this process holds it.

    That happens when a delivery's ledger write went through but its ack did not
    (the connection dropped, or the write outlived its bound), or when a report
    failed unexpectedly: left alone, the run would wait for the next start or the
    end of a drain. Its redelivery picks it up now instead (:func:`carry_on`).

    Cancelled: as :meth:`prohost.engine.blocking.Bounds.run`; the run stays in the
    ledger, for the next redelivery or start.
    """
    if harness.ledger is None:
        return
    if harness.runner is not None and run_id in harness.runner.outbox:
        # Its report waits for the server, which is evidently answering: try it now.
        harness.runner.outbox.poke()
        return
    row = await harness.bounded(harness.ledger.get, run_id,
                                what=f"reading run {run_id} from the ledger")
    if row is None or row.state is RunState.REPORTED or run_id in harness.held:
        return
    held = await held_from(harness, row)
    if held is None or run_id in harness.held:
        return
    log.warning("run %s was in the ledger (%s) but nothing here was working on it; "
                "taking it on again", run_id, row.state.value)
    carry_on(harness, held, row)


def kill_leftover(row: LedgerRow) -> None:
    """Kill the agent a previous harness left running for ``row``'s run, if any.

    By the group the ledger recorded when it has one; else (the harness died
    between the spawn and the group's commit) by the run's marker in the agent's
    environment (:func:`prohost.engine.agent.procinfo.groups_of_run`).

    Blocking (it may read /proc or run ps): call it in a worker thread.
    """
    if row.pgid is not None:
        groups = [row.pgid] if process_belongs_to_run(row.pgid, row.run_id) else []
    else:
        groups = groups_of_run(row.run_id)
    for pgid in groups:
        log.warning("killing the agent of run %s left from the previous harness (group %d)",
                    row.run_id, pgid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


async def unreported(harness: Harness) -> list[LedgerRow]:
    """Every ledger row not reported yet: pending, interrupted, then the outbox.

    Cancelled: the read is abandoned (it changes nothing).
    """
    if harness.ledger is None:
        return []
    # A read: abandoning it on a stop's deadline leaves nothing half done.
    recovery = await trio.to_thread.run_sync(harness.ledger.recover, abandon_on_cancel=True)
    return [*recovery.pending, *recovery.interrupted, *recovery.outbox]


async def sweep_ledger(harness: Harness) -> None:
    """Report every run the ledger still has unreported and nobody holds, once.

    Cancelled: the runs not held yet stay in the ledger, for the next start.
    """
    waiting = harness.runner.outbox if harness.runner is not None else ()
    for row in await unreported(harness):
        if row.run_id in harness.held or row.run_id in harness.swept or row.run_id in waiting:
            continue
        harness.swept.add(row.run_id)
        held = await held_from(harness, row)
        if held is None:
            continue
        log.warning("run %s was still unreported (%s) at the end of the drain; "
                    "reporting it now", row.run_id, row.state)
        carry_on(harness, held, row)


async def ledger_settled(harness: Harness) -> bool:
    """After the sweep: False (logged) if a run is unreported and not even in the
    outbox; outbox rows left are logged, and are the next start's to report.

    Cancelled: the read is abandoned (it changes nothing), nothing is logged.
    """
    settled = True
    waiting = []
    for row in await unreported(harness):
        if row.state is RunState.FINISHED:
            waiting.append(row.finished_at or row.accepted_at)
            log.warning("run %s could not be reported now; it stays in the ledger's "
                        "outbox and the next start reports it", row.run_id)
        else:
            log.error("run %s is still %s in the ledger and could not be reported; "
                      "the next start reports it (is the disk failing?)",
                      row.run_id, row.state)
            settled = False
    if waiting:
        # Not a failure of this harness: the outcomes are safe, the server is not
        # taking them; the exit stays 0 (§9) and the next start posts them.
        log.warning("%d report(s) wait in the ledger's outbox for the server (the oldest "
                    "run finished %s ago); the next start posts them", len(waiting),
                    human_ago(time.time() - min(waiting)))
    return settled
