"""The run queue as admission and recovery see it: the scheduler, the queued runs'
bodies, and whether the harness still takes work (a drain turns a run about to be
queued into a "not started" report, §9).

What is reported instead of queued is settled (:meth:`RunQueue.settle`): it goes to
the scheduler as a run that only needs reporting, which takes its place in line for
its lane, so a queued run is never lost, whatever is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from prohost.engine import lognames
from prohost.engine.lanes.scheduler import QueueFullError, Scheduler
from prohost.engine.run.heldrun import HeldRun, Phase, ReportOnly
from prohost.engine.run.queued_bodies import QueuedBodies
from prohost.wire.outcomes import NOT_STARTED, QUEUE_FULL
from prohost.wire.runs import Outcome

log = logging.getLogger(lognames.HARNESS)


class RunQueue:
    """Queues held runs, or reports them not started while the harness drains."""

    def __init__(self, scheduler: Scheduler[HeldRun | ReportOnly], bodies: QueuedBodies,
                 on_change: Callable[[], None]) -> None:
        self.scheduler = scheduler
        self.bodies = bodies
        self._on_change = on_change
        #: Set by the first signal (§9): nothing more is queued.
        self.draining = False

    def queued(self) -> int:
        """How many runs wait in the scheduler's queue now."""
        return self.scheduler.statistics().queued

    def settle(self, held: HeldRun, outcome: Outcome, *, recorded: bool = False,
               finished_at: float | None = None) -> bool:
        """Report ``held``, which will not execute here (:class:`ReportOnly`). It
        is ``reporting`` from now on, so neither a cancel nor a stop reaches for an
        agent it will never have, and it takes its place in line for its lane at
        once (a queued run keeps its own): a later turn neither starts nor reports
        before it (§4). Never blocks; the report is the scheduler's work. False
        (nothing changes) for a run that has left the queue: its runner reports it."""
        if not self.scheduler.settle(held.run_id, held.lane,
                                     ReportOnly(held, outcome, recorded, finished_at)):
            return False
        held.move_to(Phase.REPORTING, self._on_change)
        return True

    def put(self, held: HeldRun, body: str) -> bool:
        """Queue an accepted, held run; True once queued. A run that will start at
        once (a free slot and a free lane) keeps its parsed body; any other is queued
        light (its parsed body dropped, ``body`` kept within the budget:
        :mod:`prohost.engine.run.queued_bodies`), to be parsed again when it starts.

        During a drain it is reported "not started" instead (§9), and past the
        scheduler's cap "queue full" (both retryable): it is held, so it is reported
        rather than lost.
        """
        if self.draining:
            self.settle(held, Outcome.failure(NOT_STARTED, retryable=True))
            return False
        parsed = held.body
        if parsed is None or not self.scheduler.starts_at_once(held.lane):
            # Parsing again costs ~20 µs at start; that only pays for a run that
            # waits, where 10,000 parsed bodies would be most of the memory.
            self.bodies.keep(held, body)
        try:
            self.scheduler.submit(held.run_id, held.lane, held)
        except QueueFullError as exc:
            # Admission answers 503 before the scheduler's cap is reached, so only a
            # ledger holding more than the cap at start (an older version's rows)
            # gets here.
            log.error("%s", exc)
            self.bodies.drop(held)
            held.body = parsed
            self.settle(held, Outcome.failure(QUEUE_FULL, retryable=True))
            return False
        return True
