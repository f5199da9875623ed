"""Reports that outlived their retry window: the ledger's outbox, tried again (§7).

A completion is retried for 10 minutes while its run holds its lane
(:meth:`prohost.engine.report.reporter.Reporter.complete`). A server outage longer than
that must neither lose the result nor stall the conversation, so the run then lets
its lane go (the conversation's next turn may start) and its outcome, already in
the ledger as ``finished``, waits here::

    window ran out ─ Outbox.add ─┬─ every 5 minutes     ─ post_once ─ settled → reported
                                 ├─ each reconnect (poke)            ─ unreachable → wait
                                 └─ a redelivery (poke)              ─ 7 days old → dropped

At each start the ledger's ``finished`` rows are posted again (recovery) with a
fresh window, and land here again if that runs out too. Heartbeats keep listing
a waiting run as ``reporting`` until its report settles.

Only the run id, its completion path and when it finished are kept in memory: the
outcome (a reply may be up to 1 MiB) is read back from the ledger at each try, so
a long outage costs the harness a few hundred bytes per waiting run.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import attrs
import trio

from prohost.engine.blocking import StepTimedOut
from prohost.engine.ledger import LedgerError, RunState
from prohost.engine.ledger.interfaces import OutboxSteps
from prohost.engine.report.reporter import DEFAULT_WINDOW_S, Reporter, Settlement
from prohost.engine.retention import KEEP_RUNS_S
from prohost.wire.outcomes import UNREADABLE_OUTCOME
from prohost.wire.protocol import RunBeat
from prohost.wire.runs import Outcome

__all__ = ["MAX_AGE_S", "RETRY_EVERY_S", "Outbox", "ReportTiming", "saved_outcome"]

log = logging.getLogger("prohost.runner")

#: A waiting report is posted again this often (seconds, trio's clock; §7).
RETRY_EVERY_S = 300.0
#: A report still unsettled this long after its run finished is dropped (seconds,
#: wall clock, from the ledger's ``finished_at``; §7): when its body would be.
MAX_AGE_S = KEEP_RUNS_S


def saved_outcome(run_id: str, text: str) -> Outcome:
    """The outcome a ``finished`` row saved; when it cannot be read back,
    :data:`~prohost.wire.outcomes.UNREADABLE_OUTCOME` (retryable, logged).

    Read at a restart's recovery and at each try here: raised from either, one
    damaged row (another version's, or a disk's) would stop every start of the
    harness, or the outbox with every report waiting in it.
    """
    try:
        return Outcome.from_json(text)
    # ValueError: not JSON, or not an outcome (DecodeError); TypeError: sqlite's loose
    # typing let a non-text value in; RecursionError: JSON nested past the stack.
    except (ValueError, TypeError, RecursionError) as exc:
        log.error("run %s: its saved outcome cannot be read (%s); reporting it as an "
                  "internal error", run_id, exc)
        return Outcome.failure(UNREADABLE_OUTCOME, retryable=True)


@attrs.frozen
class ReportTiming:
    """How long reports are retried, and the wall clock their age is read on."""

    #: The retry window while the run holds its lane (seconds, trio's clock).
    window_s: float = DEFAULT_WINDOW_S
    #: Then, one more attempt this often (seconds, trio's clock).
    retry_every_s: float = RETRY_EVERY_S
    #: Dropped once the outcome is this old (seconds, wall clock).
    max_age_s: float = MAX_AGE_S
    #: Wall-clock epoch seconds: when a run finished, and how old that is.
    clock: Callable[[], float] = time.time


@attrs.define(eq=False)
class _Waiting:
    run_id: str
    completion_path: str
    #: When the run finished (wall clock, epoch seconds).
    finished_at: float
    #: When it is next tried (trio time).
    due: float


class Outbox:
    """The reports waiting for the server; see the module docstring."""

    def __init__(self, reporter: Reporter, steps: OutboxSteps, *,
                 timing: ReportTiming | None = None,
                 on_change: Callable[[], None] = lambda: None) -> None:
        self.reporter = reporter
        self.steps = steps
        self.timing = timing if timing is not None else ReportTiming()
        self._on_change = on_change
        #: run id -> its waiting report, in the order they came (oldest first).
        self._waiting: dict[str, _Waiting] = {}
        # Set when something is due sooner than the task's timer knows: a new
        # entry, or a poke.
        self._wake = trio.Event()

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._waiting

    def __len__(self) -> int:
        return len(self._waiting)

    def oldest(self) -> float | None:
        """When the oldest waiting report's run finished (epoch s); None if none waits."""
        return min((w.finished_at for w in self._waiting.values()), default=None)

    def beats(self) -> list[RunBeat]:
        """Heartbeat entries (§2): each waiting run is still ``reporting``; like a
        queued run's, the entry is only its id and state, so that a long outage's
        backlog keeps heartbeats small."""
        return [RunBeat(run_id=run_id, state="reporting") for run_id in self._waiting]

    def expired(self, finished_at: float) -> bool:
        """Whether an outcome that finished at ``finished_at`` is too old to post."""
        return self.timing.clock() - finished_at >= self.timing.max_age_s

    def add(self, run_id: str, completion_path: str, finished_at: float) -> None:
        """Keep a report whose window ran out; it is tried again in ``retry_every_s``
        (or sooner, on a poke). Its outcome must be ``finished`` in the ledger."""
        self._waiting[run_id] = _Waiting(
            run_id, completion_path, finished_at,
            due=trio.current_time() + self.timing.retry_every_s)
        self._wake.set()
        self._on_change()

    def poke(self) -> None:
        """The server is answering again (a new connection, a redelivery): try every
        waiting report now rather than at its timer. Never blocks."""
        if not self._waiting:
            return
        for waiting in self._waiting.values():
            waiting.due = -math.inf
        self._wake.set()

    def forget(self, run_id: str) -> bool:
        """Stop trying ``run_id`` (the server closed it); True if it was waiting.
        Recording it as dropped is the caller's (:meth:`record`)."""
        if self._waiting.pop(run_id, None) is None:
            return False
        self._on_change()
        return True

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Try waiting reports as they fall due, until cancelled.

        Cancelled: an attempt in flight is abandoned; every report not settled
        stays ``finished`` in the ledger, for the next start to post.
        """
        task_status.started()
        while True:
            self._wake = trio.Event()
            due = min((w.due for w in self._waiting.values()), default=math.inf)
            with trio.move_on_at(due):
                await self._wake.wait()
            await self.flush()

    async def flush(self) -> None:
        """One attempt at each report that is due, oldest first. When the server
        cannot be reached at all, the rest wait for their next turn: one failed
        connection says as much for all of them.

        Cancelled: as :meth:`run`.
        """
        now = trio.current_time()
        due = sorted((w for w in self._waiting.values() if w.due <= now),
                     key=lambda w: w.finished_at)
        for index, waiting in enumerate(due):
            if waiting.run_id not in self._waiting:
                continue  # forgotten meanwhile
            if not await self._try(waiting):
                later = trio.current_time() + self.timing.retry_every_s
                for rest in due[index:]:
                    rest.due = later
                return

    async def _try(self, waiting: _Waiting) -> bool:
        """One attempt at ``waiting``; False when the server did not answer at all."""
        run_id = waiting.run_id
        if self.expired(waiting.finished_at):
            self._waiting.pop(run_id, None)
            self._on_change()
            await self.drop_expired(run_id, waiting.finished_at)
            return True
        waiting.due = trio.current_time() + self.timing.retry_every_s
        try:
            # A read: safe to abandon on a hung disk; tried again at the next turn.
            row = await self.steps.lookup(run_id)
        except (LedgerError, OSError, StepTimedOut) as exc:
            log.warning("run %s: could not read its outcome to report it (%s); "
                        "trying again later", run_id, exc)
            return True
        if row is None or row.state is not RunState.FINISHED or row.outcome is None:
            self._waiting.pop(run_id, None)
            self._on_change()
            if row is not None and row.state is not RunState.REPORTED:
                # Its `finished` step failed (a disk fault, logged then): the next
                # start reports it as interrupted, which is all the ledger can say.
                log.warning("run %s: its outcome is not in the ledger (%s); the next "
                            "start reports it", run_id, row.state.value)
            # Else settled some other way meanwhile (or pruned): nothing to post.
            return True
        payload = saved_outcome(run_id, row.outcome).completion(run_id)
        settlement = await self.reporter.post_once(run_id, waiting.completion_path, payload)
        if settlement.kind == "gave_up":
            return settlement.status is not None
        if self._waiting.pop(run_id, None) is None:
            return True  # forgotten while it was posted: the forgetting records it
        self._on_change()
        log.info("run %s: its waiting report settled (%s)", run_id, settlement.detail)
        await self.record(run_id, settlement)
        return True

    async def record(self, run_id: str, settlement: Settlement | str) -> None:
        """``reported``, with how it settled. Never raises but for cancellation.

        Not durable: lost only with the machine, and then the next start posts the
        saved outcome again, which the server takes as a duplicate (§7). Cancelled:
        as :meth:`prohost.engine.ledger.steps.LedgerSteps.reported`.
        """
        text = settlement if isinstance(settlement, str) else \
            f"{settlement.kind}: {settlement.detail}"
        try:
            await self.steps.reported(run_id, text)
        except Exception:
            log.exception("run %s was reported but that could not be recorded; the next "
                          "start reports it again (the server takes it as a duplicate)",
                          run_id)

    async def drop_expired(self, run_id: str, finished_at: float) -> None:
        """Give up on a report ``max_age_s`` after its run finished: logged as an error
        naming the run, and closed in the ledger so that it is not tried again."""
        days = (self.timing.clock() - finished_at) / 86400
        log.error("run %s finished %.1f days ago and its report could never be delivered; "
                  "dropping it (its outcome is lost to the server)", run_id, days)
        await self.record(run_id, f"dropped: undelivered for {days:.1f} days")
