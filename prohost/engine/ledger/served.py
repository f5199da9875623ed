"""The ledger's one writer thread: the group commit's writer for a whole harness run.

Without it, the first caller that finds no writer at work is the writer, in a worker
thread of its own (:mod:`prohost.engine.ledger.writer`), and every step from the trio
thread costs a ``trio.to_thread`` hop. With it (:meth:`ServedCommit.serve`, started
and joined by the harness through :meth:`prohost.engine.ledger.steps.LedgerSteps.writer`),
a trio-side step is a :class:`Job` put on a ``queue.SimpleQueue``; the thread takes
every job waiting, makes each job's ledger calls with their writes *collected*
rather than queued (the calls only build them: no I/O), applies them all — with
whatever other threads queued meanwhile — in one batch of the same group commit
(same savepoints, same ``synchronous`` rule: a batch holding a durable write is
fsync'd), and wakes each job's trio task through ``TrioToken.run_sync_soon`` once
its last write is settled. Nothing else changes: the writes, their order, their
durability, one transaction per batch.

Calls from other threads (reads in worker threads, commands, tests calling the
ledger from sync code) keep working while the thread serves: their writes are
queued for it and they wait for them as before; when no thread serves they lead
as they always did.

The thread applies writes only; reads stay on the read connection, in worker
threads, so that a read never waits behind an fsync (WAL).

A hung disk holds this thread as it held a leading worker thread: later jobs queue,
their trio callers give up at their bound (:class:`prohost.engine.blocking.StepTimedOut`),
and the thread applies them whenever the disk answers — each write still a whole
transaction or savepoint, so the file stays consistent (an ``accepted`` write given
up on is withdrawn before a 503, or the 503 waits for it:
:meth:`prohost.engine.ledger.Ledger.withdraw_admits`).

A bug in the thread's own loop does not end it (:meth:`ServedCommit.serve`): the
round it held fails at once and it goes on; failing again and again, it hands
the steps back to worker threads, and says so.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

import trio

from prohost.engine.blocking import wake_from_thread
from prohost.engine.ledger import writer as _writer
from prohost.engine.ledger.rows import LedgerError
from prohost.engine.ledger.schema import _rollback
from prohost.engine.ledger.writer import GroupCommit, _capturing, _Write

log = logging.getLogger("prohost.ledger")

#: The writer thread's loop failing this many times in a row, without one round
#: completed between, ends it: steps fall back to worker threads (logged).
FAILURES_BEFORE_FALLBACK = 3

#: Sent to the writer thread to end it (:meth:`ServedCommit.stop_serving`).
_STOP = object()

#: In the writer thread: the jobs settled in this round, to wake together.
_round = threading.local()


def _wake(jobs: list[Job]) -> None:
    """Wake ``jobs``' callers in their trio threads, one ``run_sync_soon`` per trio
    run; a run that is over has nobody waiting."""
    by_token: dict[trio.lowlevel.TrioToken, list[Callable[[], None]]] = {}
    for job in jobs:
        job._read_then()
        by_token.setdefault(job.token, []).append(job.wake)
    for token, wakes in by_token.items():
        wake_from_thread(token, _call_all, wakes)


def _end_round() -> None:
    if _round.jobs:
        _wake(_round.jobs)
        _round.jobs = []


def _call_all(wakes: list[Callable[[], None]]) -> None:
    for wake in wakes:
        wake()


class Job:
    """One trio-side ledger step for the writer thread: ``fn(*args)``, a ledger call
    (or a few) that does nothing but queue writes.

    Filled by the writer thread before ``wake`` is called; read by the caller after.
    """

    __slots__ = ("args", "error", "fn", "queued", "returned", "then", "then_error", "token",
                 "wake", "woken", "writes")

    def __init__(self, fn: Callable[..., Any], args: tuple[object, ...],
                 token: trio.lowlevel.TrioToken, wake: Callable[[], None], *,
                 then: Callable[[], Any] | None = None) -> None:
        self.fn = fn
        self.args = args
        #: A read for the result, made once the job's writes are committed (by the
        #: thread that wakes the caller: no hop of its own); what it raised.
        self.then = then
        self.then_error: BaseException | None = None
        #: Called in the trio thread of ``token`` once every write of the job is
        #: settled (see :meth:`settled`).
        self.token = token
        self.wake = wake
        self.writes: list[_Write] = []
        self.returned: Any = None
        #: What the call raised before any write was queued (say, an ``OSError``).
        self.error: BaseException | None = None
        #: Its writes are queued (their settling wakes it); it was settled.
        self.queued = False
        self.woken = False

    def settled(self) -> None:
        """Every write of the job is settled: in the writer thread, wake the caller
        with the rest of the round's (one ``run_sync_soon`` per round, not per job:
        each is a wake-up of the trio thread); in any other thread, at once."""
        self.woken = True
        pending: list[Job] | None = getattr(_round, "jobs", None)
        if pending is not None:
            pending.append(self)
        else:
            _wake([self])

    def _read_then(self) -> None:
        if self.then is None or self.error is not None:
            return
        if any(write.waits and write.error is not None for write in self.writes):
            return
        try:
            self.returned = self.then()
        except Exception as exc:  # the read's own error, for its caller
            self.then_error = exc

    def outcome(self) -> Any:
        """What the call would have returned (or raises what it would have raised)
        had it been made in a worker thread: the first error of a write it waited
        for, else its own return value or, when ``None``, its last awaited write's."""
        if self.error is not None:
            raise self.error
        waited = [write for write in self.writes if write.waits]
        for write in waited:
            if not write.done:
                raise LedgerError("prohost bug: a ledger step returned before its "
                                  "write was applied")
            if write.error is not None:
                raise write.error
        if self.then_error is not None:
            raise self.then_error
        if self.returned is None and waited:
            return waited[-1].result
        return self.returned


class _Serving:
    """What the writer thread's current round holds, for :meth:`ServedCommit._fail_round`."""

    __slots__ = ("batch", "jobs", "rounds", "stopping")

    def __init__(self) -> None:
        self.stopping = False
        #: Rounds completed since the last failure.
        self.rounds = 0
        self.jobs: list[Job] = []
        self.batch: list[_Write] = []


class ServedCommit(GroupCommit):
    """A :class:`GroupCommit` that one long-lived writer thread can serve."""

    @property
    def serving(self) -> bool:
        """A writer thread serves the file now (it may end at any time: a
        :meth:`submit` says for sure)."""
        return self._serving

    def submit(self, job: Job) -> bool:
        """Put ``job`` on the writer thread's queue without waiting: True once it is
        there, False when no writer thread serves (nothing was queued: make the call
        in a worker thread then). Never blocks on I/O, so the trio thread may call it.
        """
        with self._mu:
            if self._closed:
                raise LedgerError(f"harness bug: the run ledger {self.path} is closed")
            if not self._serving:
                return False
            # Under _mu: the thread's last look (see serve) sees it or ends before.
            self._wakes.put(job)
        return True

    def begin_serving(self) -> bool:
        """Claim the role for a thread about to run :meth:`serve`; False when one
        already serves (say, one still held by a hung disk) or the file is closed."""
        with self._mu:
            if self._serving or self._closed:
                return False
            self._serving = True
            return True

    def stop_serving(self) -> None:
        """Ask the writer thread to apply everything queued, then end (at once)."""
        self._wakes.put(_STOP)

    def serve(self) -> None:
        """The writer thread's body, after :meth:`begin_serving`: take the jobs and
        wake-ups waiting, apply every write queued, in batches, until stopped (or
        closed) with nothing left; callers then lead again as without it.

        An unexpected exception in its loop (a prohost bug) does not end it: what
        that round held — jobs taken, a batch taken and not settled — is failed
        with :class:`LedgerError` at once (their callers hear now, not at their
        bound), it is logged, and the loop goes on with what is queued (issue 27,
        point 5). Should anything still end the thread, it stops serving on its way
        out, so that callers lead again rather than wait for a thread that is gone.
        """
        state = _Serving()
        _round.jobs = []
        failed_in_a_row = 0
        try:
            while not self._serve_rounds(state):
                # _serve_rounds failed: fail what its round held, then go on.
                self._fail_round(state)
                failed_in_a_row = 0 if state.rounds else failed_in_a_row + 1
                state.rounds = 0
                if failed_in_a_row >= FAILURES_BEFORE_FALLBACK:
                    self._fall_back()
                    return
        finally:
            _round.jobs = None
            with self._mu:
                self._serving = False  # (already, unless something ended it early)

    def _fall_back(self) -> None:
        """The loop fails before it can take anything, again and again: stop serving
        (steps go to worker threads, which lead the group commit as without the
        thread; the next one applies what is queued) and fail the jobs still
        waiting for this thread."""
        with self._mu:
            self._serving = False
            left: list[Job] = []
            while True:
                try:
                    item = self._wakes.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, Job):
                    left.append(item)
        log.error("the ledger's writer thread keeps failing (a prohost bug); ledger "
                  "steps fall back to worker threads, each leading the group commit")
        failed = LedgerError(f"the run ledger {self.path}'s writer thread failed (a "
                             "prohost bug; logged); try again")
        for job in left:
            job.error = failed
            job.settled()
        # Writes already queued (jobs taken before) have no caller to lead: lead
        # once here, as a worker thread would, through the plain group commit.
        with self._mu:
            lead = bool(self._queue) and not self._writing
            if lead:
                self._writing = True
        if lead:
            try:
                self._lead()
            except Exception:
                log.exception("the ledger's writer thread could not apply what was queued")
                with self._mu:
                    stranded, self._queue = self._queue, []
                    self._writing = False
                self._settle(stranded, error=failed)
        _end_round()

    def _serve_rounds(self, state: _Serving) -> bool:
        """Rounds until stopped with nothing left (True); False, logged, when one
        failed unexpectedly (``state`` says what it held)."""
        try:
            while True:
                item = self._wakes.get()
                state.jobs = []
                while True:
                    if item is _STOP:
                        state.stopping = True
                    elif isinstance(item, Job):
                        state.jobs.append(item)
                    try:
                        item = self._wakes.get_nowait()
                    except queue.Empty:
                        break
                self._queue_jobs(state.jobs)
                _end_round()
                while self._take_and_apply(state):
                    _end_round()  # a batch's callers go on while the next one commits
                state.jobs = []
                state.rounds += 1
                with self._mu:
                    if ((state.stopping or self._closed) and not self._queue
                            and not self._writing and self._wakes.empty()):
                        # Under _mu: a submit sees it, or was seen above.
                        self._serving = False
                        return True
        except Exception:
            log.exception("the ledger's writer thread failed (a prohost bug); the writes "
                          "it held fail, and it goes on serving")
            return False

    def _fail_round(self, state: _Serving) -> None:
        """After a failed round: settle with an error every job taken and every
        write of the batch taken that nothing settled, wake their callers, and look
        at the queue again at once (what was queued is still there)."""
        failed = LedgerError(f"the run ledger {self.path}'s writer thread failed (a "
                             "prohost bug; logged); try again")
        batch, state.batch = state.batch, []
        with self._mu:
            unsettled = [write for write in batch if not write.done]
        # A transaction the failure left open would make every later BEGIN fail:
        # none of its writes is settled yet, so none of it may stay.
        if self._lock.acquire(timeout=_writer.LOCK_WAIT_S):
            try:
                if self._conn is not None:
                    _rollback(self._conn)
            finally:
                self._lock.release()
        if unsettled:
            self._settle(unsettled, error=failed)
        for job in state.jobs:
            if not job.queued and not job.woken:
                if job.error is None:
                    job.error = failed
                job.settled()
        state.jobs = []
        try:
            _end_round()
        except Exception:
            log.exception("the ledger's writer thread could not wake its callers")
            _round.jobs = []
        self._wakes.put(None)

    def _queue_jobs(self, jobs: list[Job]) -> None:
        """Make each job's calls with their writes collected, then queue the writes,
        in order; a job without writes is done at once."""
        for job in jobs:
            _capturing.writes = job.writes
            try:
                job.returned = job.fn(*job.args)
            except Exception as exc:  # the call's own error, for its caller
                job.error = exc
            finally:
                _capturing.writes = None
        ready: list[Job] = []
        with self._mu:
            for job in jobs:
                if job.writes and job.error is None and not self._closed:
                    _cut_before_waiting(job.writes)
                    # Woken once its last write is settled (_settle), whatever the batch.
                    job.writes[-1].notify = job.settled
                    self._queue.extend(job.writes)
                    job.queued = True
                else:
                    if self._closed and job.error is None and job.writes:
                        job.error = LedgerError(
                            f"harness bug: the run ledger {self.path} is closed")
                    ready.append(job)
        for job in ready:
            job.settled()

    def _take_and_apply(self, state: _Serving | None = None) -> bool:
        """One batch; False when there was none to take (the queue empty, or a caller
        that was the writer before the thread began still is: it wakes the thread
        when it is done, so batches stay in order)."""
        with self._mu:
            if self._writing or not self._queue:
                return False
            batch, self._queue = self._queue, []
            self._writing = True
        if state is not None:
            state.batch = batch  # failed by _fail_round should this raise
        try:
            if not self._lock.acquire(timeout=_writer.LOCK_WAIT_S):
                # Only a step abandoned on a hung disk holds the connection this long.
                self._settle(batch, error=self._busy())
                return True
            try:
                start = 0
                for end, write in enumerate(batch, 1):
                    if write.cut or end == len(batch):
                        self._apply(batch[start:end])
                        start = end
            finally:
                self._lock.release()
        finally:
            with self._mu:
                self._writing = False
        if state is not None:
            state.batch = []
        return True



def _cut_before_waiting(writes: list[_Write]) -> None:
    """Writes a step does not wait for, queued before one it waits for (the lane's
    session before ``finished``), are committed before it, as when the step's
    caller was the writer: a crash between the two commits leaves the session
    kept and the run not finished, which the next start reports as interrupted
    (the fault matrix's ``session``/``after`` cell)."""
    for index, write in enumerate(writes[1:], 1):
        if write.waits and not writes[index - 1].waits:
            writes[index - 1].cut = True
            return
