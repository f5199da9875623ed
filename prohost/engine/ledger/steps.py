"""A run's ledger steps as the runner takes them: each one bounded, and as few
thread hand-offs per run as the durability rules allow (PROTOCOL.md §7).

While the harness runs, every write step is a job for the ledger's one writer
thread (:meth:`LedgerSteps.writer`, :mod:`prohost.engine.ledger.served`): put on its
queue from the trio thread, woken by it once committed — no worker thread. The
lane's session is read in the same job as ``started`` (by the writer thread, on
the read connection, once that commit is done), and saved in the same job as
``finished``; ``reported`` is queued from the trio thread without waiting. Reads
(a queued run's body, a row) still take a worker thread: they must not wait
behind an fsync. Without the writer thread (a test's bare :class:`LedgerSteps`)
each step is a worker-thread hop, as before.

Two steps are never skipped (§7): ``started`` and the agent's process group. When
either cannot be written — a :class:`LedgerError` (disk full, I/O error, read-only),
an ``OSError``, or a write that does not return within its bound
(:class:`StepTimedOut`) — the error is raised to the runner: without ``started`` the
agent is not spawned, without its group it is killed, and the run is reported as a
retryable internal error. The other steps are logged and the run goes on: the
report matters most, and the next start repairs what the ledger lacks.

A step begun is finished even when its run is cancelled (the ledger must not
disagree with what was done), but bounded: after :data:`LEDGER_STEP_TIMEOUT_S`, or
at the second signal's deadline (``bounds.hurry``), it is abandoned and logged,
and the next start finds the run wherever the ledger has it.
"""

from __future__ import annotations

import functools
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import trio

from prohost.engine.blocking import Bounds, Elsewhere, StepTimedOut
from prohost.engine.ledger import Ledger, LedgerError, LedgerOrderError
from prohost.engine.ledger.served import Job

log = logging.getLogger("prohost.runner")

T = TypeVar("T")

#: Bound on one ledger step (s). A step is a local fsync; if it takes longer, the
#: disk is in trouble, and the step is abandoned (prohost.engine.blocking).
LEDGER_STEP_TIMEOUT_S = 30.0

#: A step that must be written before the run goes on (``finished``) is tried again
#: after this long when the disk refuses it (s), doubling up to the cap.
RETRY_FIRST_S = 1.0
RETRY_CAP_S = 30.0

#: How long the harness waits for the ledger's writer thread to end (s), within the
#: second signal's deadline if there is one; a thread still held by a hung disk is
#: left to the process exit (it is a daemon thread), and said so.
WRITER_JOIN_S = 2.0

#: The ledger calls that do nothing but queue writes (no read, no flush before
#: them): while the writer thread serves, a step of one is a job for that thread.
WRITES_ONLY = frozenset({
    "admit", "mark_started", "record_pgid", "mark_finished", "mark_reported",
    "save_session", "save_turn", "save_account_limits", "prune",
})

#: A lane's turn to save with its run's ``finished`` step: lane, account, and the
#: session the turn ended with (``None`` forgets the lane's session).
Turn = tuple[str, str, str | None, str | None]


class StepNotWritten(Exception):
    """A step the run cannot go on without (``started``, the process group) was
    refused by the disk: the run stops there and is reported (§7). Expected of a
    full or failing disk, so it is logged in one line, without a traceback."""


class LedgerSteps:
    """The bounded ledger steps of one harness's runs (see the module docstring)."""

    def __init__(self, ledger: Ledger, bounds: Bounds | None = None) -> None:
        self.ledger = ledger
        #: The harness's bounds (its other file steps share them); the second signal
        #: hurries them.
        self.bounds = bounds if bounds is not None else Bounds()

    async def writer(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                     ) -> None:
        """The ledger's one writer thread (:mod:`prohost.engine.ledger.served`), for as
        long as this task runs: started here, then stopped and joined when it is
        cancelled. (None is started while another still serves the file, say one
        held by a hung disk: steps go to that one, or to worker threads.)

        Cancelled: the thread applies what is queued and ends; this waits for it,
        shielded, at most :data:`WRITER_JOIN_S` and never past the second signal's
        deadline. A thread still held by a hung disk is then left running (a
        daemon thread: it does not hold the exit) and logged; later steps go to
        worker threads, as without it.
        """
        if not self.ledger.begin_serving():
            task_status.started()
            return
        token = trio.lowlevel.current_trio_token()
        ended = trio.Event()

        def serve() -> None:
            try:
                self.ledger.serve()
            except Exception:
                log.exception("the ledger's writer thread failed (a prohost bug)")
            finally:
                _wake(token, ended.set)

        thread = threading.Thread(target=serve, name="prohost ledger writer", daemon=True)
        thread.start()
        try:
            task_status.started()
            await trio.sleep_forever()
        finally:
            self.ledger.stop_serving()
            with trio.CancelScope(shield=True, deadline=self.bounds.deadline(WRITER_JOIN_S)):
                await ended.wait()
            if ended.is_set():
                thread.join()  # it has returned: at once
            else:
                log.warning("the ledger's writer thread is still busy (a hung disk?); "
                            "leaving it to the process exit")

    async def bounded(self, fn: Callable[..., T], *args: object, what: str) -> T:
        """A blocking ledger (or /proc) call in a worker thread — or, for a call that
        only writes (:data:`WRITES_ONLY`) while the ledger's writer thread serves, a
        job for that thread — abandoned after :data:`LEDGER_STEP_TIMEOUT_S` or at the
        second signal's deadline; only for calls that are safe to abandon (reads,
        whole transactions).

        Cancelled: as :meth:`prohost.engine.blocking.Bounds.run`.
        """
        call: Callable[..., T] | Elsewhere[T] = fn
        if self.ledger.serving and self._writes_only(fn):
            submitted: tuple[Job, Elsewhere[T]] | None = self._submitted(fn, args)
            if submitted is not None:
                call = submitted[1]
        return await self.bounds.run(call, *args, limit_s=LEDGER_STEP_TIMEOUT_S, what=what)

    def _writes_only(self, fn: Callable[..., object]) -> bool:
        inner = fn.func if isinstance(fn, functools.partial) else fn
        owner = getattr(inner, "__self__", None)
        name = getattr(inner, "__name__", "")
        if owner is self:
            return name == "save_turn_and_finish"
        return owner is self.ledger and name in WRITES_ONLY

    def _submitted(self, fn: Callable[..., object], args: tuple[object, ...],
                   then: Callable[[], T] | None = None) -> tuple[Job, Elsewhere[T]] | None:
        """``fn(*args)`` put on the writer thread's queue (with ``then``, read by that
        thread once its writes are committed, for the result): the job and what to
        wait for, or None when no writer thread serves (make the call in a worker
        thread then)."""
        done = trio.Event()
        job = Job(fn, args, trio.lowlevel.current_trio_token(), done.set, then=then)
        if not self.ledger.submit(job):
            return None

        async def written() -> T:
            await done.wait()
            result: T = job.outcome()
            return result

        return job, Elsewhere(written)

    async def read_body(self, run_id: str) -> str | None:
        """A queued run's body, read back from the ledger (a read, safe to abandon).
        Cancelled: as :meth:`bounded`."""
        return await self.bounded(self.ledger.body, run_id,
                                  what=f"reading run {run_id} from the ledger")

    async def started_then_session(self, run_id: str, lane: str, account: str) -> str | None:
        """The ``started`` step (durable: before the spawn), then the session the
        lane's last turn on ``account`` ended with, in one hand-off (a job for the
        writer thread, or one worker thread without it).

        Raises whatever stopped either (:class:`LedgerError`, ``OSError``,
        :class:`StepTimedOut` past the bound): the caller must not spawn the agent
        then (§7), and reports the run as an internal error. Cancelled: as
        :meth:`bounded` (a step begun is finished, within its bound).
        """
        # Abandoning it on a hung disk is safe: a ledger step (see step) and a
        # read on the ledger's read connection; the run then fails with the StepTimedOut.
        what = "the ledger step mark_started, or reading the lane's session"
        now = time.time()
        # The read goes with the job: the writer thread makes it once the commit is
        # done (one hand-off for both, and it sees that commit).
        submitted = self._submitted(
            self.ledger.mark_started, (run_id, now),
            then=functools.partial(self.ledger.account_session, lane, account))
        if submitted is None:
            return await self.bounded(self._started_then_session, run_id, now, lane,
                                      account, what=what)
        job, written = submitted
        try:
            return await self.bounds.run(written, limit_s=LEDGER_STEP_TIMEOUT_S, what=what)
        except (LedgerOrderError, StepTimedOut):
            raise
        except (LedgerError, OSError, sqlite3.Error) as exc:
            if exc is job.then_error:
                raise  # the read failed, not the step (as from a worker thread)
            raise StepNotWritten(f"the ledger step mark_started could not be written: "
                                 f"{exc}") from exc

    def _started_then_session(self, run_id: str, now: float, lane: str,
                              account: str) -> str | None:
        """In a worker thread: ``started``, then the lane's session on ``account``
        (it sees that commit and every one before). One hop for both.

        A failed ``started`` raises, never logged and skipped: spawning without it
        would leave a row ``accepted`` that the next start runs a second time."""
        try:
            self.ledger.mark_started(run_id, now)
        except (LedgerOrderError, StepNotWritten):
            raise
        except (LedgerError, OSError, sqlite3.Error) as exc:
            raise StepNotWritten(f"the ledger step mark_started could not be written: "
                                 f"{exc}") from exc
        return self.ledger.account_session(lane, account)

    async def record_pgid(self, run_id: str, pgid: int) -> None:
        """The spawned agent's process group, durable before the harness waits on
        its output (§7), so that a restart after a ``kill -9`` finds and kills it.

        Raises what stopped the write (as :meth:`started_then_session`); the caller
        then kills the group and reports the run as an internal error.
        Cancelled: as :meth:`bounded`.
        """
        try:
            await self.bounded(self.ledger.record_pgid, run_id, pgid,
                               what="the ledger step record_pgid")
        except LedgerOrderError:
            raise
        except (LedgerError, OSError, sqlite3.Error) as exc:
            raise StepNotWritten(f"the ledger step record_pgid could not be written: "
                                 f"{exc}") from exc

    def save_turn_and_finish(self, run_id: str, outcome_json: str, now: float,
                             turn: Turn | None) -> None:
        """In a worker thread: the lane's session (not durable: queued first, it is in
        the ``finished`` commit or an earlier one, so finished ⇒ session kept), then
        ``finished`` (durable). One hop for both."""
        if turn is not None:
            lane, account, session_id, totals = turn
            try:
                self.ledger.save_turn(lane, account, session_id, now, durable=False,
                                      totals=totals)
            except Exception:
                log.exception("run %s: could not save the session of %s", run_id, lane)
        self.ledger.mark_finished(run_id, outcome_json, now)

    async def until_written(self, step: Callable[..., object], *args: object,
                            what: str) -> None:
        """A durable step the run cannot go on without (``finished``: the outcome
        must be in the outbox before it is posted, or a restart would report the run
        a second time, differently): tried until it is written, again after 1 s,
        2 s, … up to every 30 s while the disk refuses it (full, read-only, failing,
        hung past the bound), each failure logged. A step the ledger refuses as out
        of order (:class:`LedgerOrderError`) is logged and not tried again: no retry
        can change that answer.

        Cancelled: a write begun is finished or abandoned as in :meth:`bounded`;
        between tries, at once. The step then stays unwritten, and the next start
        finds the run where the ledger has it (§7).
        """
        delay = RETRY_FIRST_S
        while True:
            try:
                await self.bounded(step, *args, what=what)
                return
            except LedgerOrderError as exc:
                log.error("ledger: %s", exc)
                return
            except (LedgerError, OSError, sqlite3.Error) as exc:
                log.error("ledger: %s could not be written (%s); the run waits and tries "
                          "again in %.0f s (is the disk full?)", what, exc, delay)
            await trio.sleep(delay)
            delay = min(delay * 2, RETRY_CAP_S)

    async def soon(self, step: Callable[..., bool], *args: object) -> None:
        """A ledger step written with ``durable=False`` (``mark_reported``): queued
        from the trio thread for the ledger's writer when one is at work (no worker
        thread), else as :meth:`step` does.

        Cancelled: as :meth:`step` (queuing never waits).
        """
        try:
            if step(*args, durable=False, queue_only=True):
                return
        except LedgerError as exc:
            log.error("ledger: %s", exc)
            return
        await self.step(step, *args, durable=False)

    async def step(
        self, step: Callable[..., object], *args: object, durable: bool = True,
        what: str | None = None,
    ) -> None:
        """One ledger step, in a worker thread; with ``durable``, once it is fsync'd.
        Without, once it is queued for the next commit (or committed, without an
        fsync, when nothing else was being written). A step that fails (a
        :class:`LedgerError`, an ``OSError`` such as ENOSPC) is logged and the run
        goes on: only for steps the run can do without (not ``started`` nor the
        process group: see the module docstring).

        Cancelled: not interrupted — a step that was begun is finished even when
        the run is being cancelled, or the ledger would disagree with what was
        done — but bounded: after LEDGER_STEP_TIMEOUT_S, or at the second signal's
        deadline, the step is abandoned and logged, and the run goes on; the next
        start finds the run wherever the ledger has it and reports it (§7).
        """
        if what is None:
            what = f"the ledger step {getattr(step, '__name__', 'step')}"
        try:
            # Abandoning is safe: each ledger write is a whole transaction (or a
            # savepoint of one) that the ledger's writer completes or rolls back
            # on its own (see prohost.engine.ledger and prohost.engine.blocking).
            call = step if durable else functools.partial(step, durable=False)
            await self.bounded(call, *args, what=what)
        except LedgerError as exc:
            # A step out of order (say, a drop racing a report that just
            # settled) must not take the run's task down with it.
            log.error("ledger: %s", exc)
        except OSError as exc:
            # A failing disk (ENOSPC, EIO) or a hung one (StepTimedOut is an
            # OSError) fails this step, not the run: the next start repairs it.
            log.error("ledger: %s", exc)


def _wake(token: trio.lowlevel.TrioToken, wake: Callable[[], Any]) -> None:
    """From another thread: ``wake()`` in the trio thread, unless trio's run is over
    (then nobody waits for it)."""
    try:
        token.run_sync_soon(wake)
    except trio.RunFinishedError:
        return  # (not contextlib.suppress: this is every step's path, and cheaper)
