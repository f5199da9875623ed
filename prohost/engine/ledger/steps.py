"""The ledger's one face for the rest of the harness: :class:`LedgerSteps`, one
named method per step (admit, lookup, started, record_pgid, finished, reported,
the sessions, the limits, the reads at start, prune), each bounded, and each
choosing in its own code which thread it takes and how durable it is — with as
few thread hand-offs per run as the durability rules allow (docs/protocol.md §7).
Nothing outside :mod:`prohost.engine.ledger` calls the :class:`Ledger` itself.
Each part is typed with the narrow part of it it uses
(:mod:`prohost.engine.ledger.interfaces`); only the harness, which makes it, holds
the whole.

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
from typing import TypeVar

import attrs
import trio

from prohost.engine.blocking import Bounds, StepTimedOut, wake_from_thread
from prohost.engine.ledger import (
    Admitted,
    Ledger,
    LedgerError,
    LedgerOrderError,
    LedgerRow,
    UnreportedRuns,
)
from prohost.engine.ledger.served import Job
from prohost.engine.ledger.store import AdmitTicket

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


@attrs.frozen
class LaneTurn:
    """What a run's turn leaves its lane, saved with the run's ``finished`` step: the
    account it ran on, the session it ended with (``None`` forgets the lane's
    session on that account) and that session's running usage totals (JSON), for a
    CLI that reports those."""

    lane: str
    account: str
    session_id: str | None
    totals: str | None = None


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
        #: The threads that wait for an ``accepted`` write to settle (:meth:`settled`):
        #: apart from trio's default limiter, which the ledger steps use; past 16 the
        #: others wait for one in trio, holding no thread.
        self._settling = trio.CapacityLimiter(16)

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
                wake_from_thread(token, ended.set)

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

    # -- how a step is taken ----------------------------------------------------------

    async def _read(self, fn: Callable[..., T], *args: object, what: str) -> T:
        """A read of the ledger (or of /proc) in a worker thread, on the ledger's read
        connection: it never waits behind a write under way. Abandoned after
        :data:`LEDGER_STEP_TIMEOUT_S` or at the second signal's deadline, which is
        safe for a read. Cancelled: as :meth:`prohost.engine.blocking.Bounds.run`."""
        return await self.bounds.run(fn, *args, limit_s=LEDGER_STEP_TIMEOUT_S, what=what)

    async def _write(self, fn: Callable[..., T], *args: object, what: str) -> T:
        """A call that does nothing but queue writes: a job for the ledger's writer
        thread while one serves (no worker thread), else a worker thread's call
        (it leads the group commit). Bounded and abandoned as :meth:`_read`, which is
        safe: each write is a whole transaction (or a savepoint of one) that the
        writer completes or rolls back on its own. Cancelled: as
        :meth:`prohost.engine.blocking.Bounds.run`."""
        submitted = self._submitted(fn, args)
        if submitted is None:
            return await self.bounds.run(fn, *args, limit_s=LEDGER_STEP_TIMEOUT_S, what=what)
        job, done = submitted
        await self.bounds.wait(done, limit_s=LEDGER_STEP_TIMEOUT_S, what=what)
        result: T = job.outcome()
        return result

    def _submitted(self, fn: Callable[..., object], args: tuple[object, ...],
                   then: Callable[[], object] | None = None
                   ) -> tuple[Job, trio.Event] | None:
        """``fn(*args)`` put on the writer thread's queue (with ``then``, read by that
        thread once its writes are committed, for the result): the job, whose
        :meth:`~Job.outcome` is the step's, and the event that thread sets once it
        is over (wait for it with ``bounds.wait``); or None when no writer thread
        serves (make the call in a worker thread then)."""
        if not self.ledger.serving:
            return None
        done = trio.Event()
        job = Job(fn, args, trio.lowlevel.current_trio_token(), done.set, then=then)
        if not self.ledger.submit(job):
            return None
        return job, done

    async def _logged(self, fn: Callable[..., object], *args: object, what: str) -> None:
        """A durable write the run can do without: a failure (a :class:`LedgerError`,
        an ``OSError`` such as ENOSPC, a hung disk's :class:`StepTimedOut`) is logged
        and the run goes on; the next start repairs what the ledger lacks.

        Cancelled: not interrupted (a step begun is finished, or the ledger would
        disagree with what was done) but bounded, as :meth:`_write`.
        """
        try:
            await self._write(fn, *args, what=what)
        except (LedgerError, OSError) as exc:
            # A step out of order (a drop racing a report that just settled) or a
            # failing disk fails this step, not the run.
            log.error("ledger: %s", exc)

    # -- admission (§3) ------------------------------------------------------------------

    async def admit(self, run_id: str, lane: str, body: str) -> Admitted:
        """``accepted``, durable before the ack (§3, §7); what the ledger already
        had of ``run_id`` if anything.

        Raises what stopped it (:class:`LedgerError`, ``OSError``,
        :class:`StepTimedOut` past the bound). Before the delivery is then refused
        (503), :meth:`under_way` must say that no write of the run can still land
        (issue 27, point 3).
        Cancelled: as :meth:`_write` (a write begun is finished, within its bound:
        no ack is sent for it, and its redelivery finds it or waits for it).
        """
        now = time.time()
        ticket = AdmitTicket(run_id, now)
        # Known before the call is queued: a 503 decided while it waits in the
        # writer thread's queue withdraws it.
        self.ledger.expect_admit(ticket)
        return await self._write(functools.partial(self.ledger.admit, ticket=ticket),
                                 run_id, lane, body, now,
                                 what=f"recording run {run_id} in the ledger")

    def under_way(self, run_id: str) -> list[AdmitTicket]:
        """Before a 503 for ``run_id``: every ``accepted`` write of it not applied yet
        is withdrawn (it will insert nothing), and the ones whose transaction is
        under way are returned — while any is, a 503 could be followed by the row
        landing (:meth:`Ledger.withdraw_admits`). No I/O: the trio thread may ask."""
        return self.ledger.withdraw_admits(run_id)

    async def settled(self, tickets: list[AdmitTicket]) -> None:
        """Wait until the disk has said whether each of ``tickets`` landed — with no
        bound: whatever the ack of their run says before that could be wrong.
        Cancelled: at once (the waiting thread is abandoned; it ends when the disk
        answers)."""
        for ticket in tickets:
            if not ticket.done.is_set():
                # A hung disk holds one such thread per redelivery waiting: they
                # must not starve the ledger steps of trio's threads.
                await trio.to_thread.run_sync(ticket.done.wait, abandon_on_cancel=True,
                                              limiter=self._settling)

    async def known(self, run_id: str) -> LedgerRow | None:
        """The ledger's row of ``run_id`` as last committed, if it has one: a read
        on the read connection that never waits for what is queued, so a hung write
        cannot hold it (issue 27, point 6). Enough for admission (see
        :meth:`prohost.engine.supervisor.admission.Admission.admit`); a row being
        withdrawn is not shown. Raises as :meth:`admit`. Cancelled: as :meth:`_read`."""
        return await self._read(self.ledger.committed, run_id,
                                what=f"looking run {run_id} up in the ledger")

    def stalled(self) -> bool:
        """The ledger's writer has been applying one batch for a while (a slow or hung
        disk): a write queued now would wait for it. No I/O: the trio thread may ask."""
        return self.ledger.stalled()

    async def lookup(self, run_id: str) -> LedgerRow | None:
        """The ledger's row of ``run_id``, if it has one (a read; it first waits for
        what is queued). Raises as :meth:`admit`. Cancelled: as :meth:`_read`."""
        return await self._read(self.ledger.get, run_id,
                                what=f"looking run {run_id} up in the ledger")

    async def read_body(self, run_id: str) -> str | None:
        """A queued run's body, read back from the ledger (a read, safe to abandon).
        Cancelled: as :meth:`_read`."""
        return await self._read(self.ledger.body, run_id,
                                what=f"reading run {run_id} from the ledger")

    # -- a run's steps (§5, §7, §12) -----------------------------------------------------

    async def lane_account(self, lane: str) -> str | None:
        """The account the lane's last turn used, if any (a read). Cancelled: as
        :meth:`_read`."""
        return await self._read(self.ledger.lane_account, lane,
                                what="reading the lane's account")

    async def account_session(self, lane: str, account: str) -> str | None:
        """The session the lane's last turn on ``account`` ended with (a read).
        Cancelled: as :meth:`_read`."""
        return await self._read(self.ledger.account_session, lane, account,
                                what="reading the lane's session from the ledger")

    async def session_totals(self, session_id: str) -> str | None:
        """The running usage totals (JSON) ``session_id`` had reached, if its CLI
        reports them and the ledger has them (a read). Cancelled: as :meth:`_read`."""
        return await self._read(self.ledger.session_totals, session_id,
                                what="reading the session's usage")

    async def started(self, run_id: str, lane: str, account: str) -> str | None:
        """The ``started`` step (durable: before the spawn), then the session the
        lane's last turn on ``account`` ended with, in one hand-off (a job for the
        writer thread, or one worker thread without it).

        Raises whatever stopped either (:class:`StepNotWritten` for the write,
        :class:`LedgerError` or ``OSError`` for the read, :class:`StepTimedOut` past
        the bound): the caller must not spawn the agent then (§7), and reports the
        run as an internal error. Cancelled: as :meth:`_write` (a step begun is
        finished, within its bound).
        """
        # Abandoning it on a hung disk is safe: a ledger step and a read on the
        # ledger's read connection; the run then fails with the StepTimedOut.
        what = "the ledger step mark_started, or reading the lane's session"
        now = time.time()
        # The read goes with the job: the writer thread makes it once the commit is
        # done (one hand-off for both, and it sees that commit).
        submitted = self._submitted(
            self.ledger.mark_started, (run_id, now),
            then=functools.partial(self.ledger.account_session, lane, account))
        if submitted is None:
            return await self._read(self._started_then_session, run_id, now, lane,
                                    account, what=what)
        job, done = submitted
        try:
            await self.bounds.wait(done, limit_s=LEDGER_STEP_TIMEOUT_S, what=what)
            session: str | None = job.outcome()
            return session
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

    async def record_pgid(self, run_id: str, pgid: int, start_state: str | None = None
                          ) -> None:
        """The spawned agent's process group, durable before the harness waits on
        its output (§7), so that a restart after a ``kill -9`` finds and kills it;
        with it, in the same commit, what the run's checkouts were as it began
        (``start_state``, JSON), so that the restart reports what the run changed.

        Raises what stopped the write (as :meth:`started`); the caller then kills
        the group and reports the run as an internal error.
        Cancelled: as :meth:`_write`.
        """
        try:
            await self._write(self.ledger.record_pgid, run_id, pgid, start_state,
                              what="the ledger step record_pgid")
        except LedgerOrderError:
            raise
        except (LedgerError, OSError, sqlite3.Error) as exc:
            raise StepNotWritten(f"the ledger step record_pgid could not be written: "
                                 f"{exc}") from exc

    async def interrupted_turn(self, lane: str) -> None:
        """A turn of ``lane`` ended with the harness before its usage was read: the
        lane's next turn says its figures may hold it
        (:meth:`~prohost.engine.ledger.sessions.SessionRows.flag_earlier_turns`).
        A failure is logged, never raised: it costs only the flag.
        Cancelled: as :meth:`_logged`."""
        await self._logged(self.ledger.flag_earlier_turns, lane, time.time(),
                           what="the ledger step flag_earlier_turns")

    async def cancelled(self, run_id: str, outcome_json: str) -> None:
        """The server's cancel of a run not finished yet, durable before its agent is
        stopped (§6: a cancel is final once the harness holds it, a ``kill -9``
        and a restart included). Raises what stopped the write (as
        :meth:`record_pgid`); the caller stops the agent all the same.
        Cancelled: as :meth:`_write`."""
        try:
            await self._write(self.ledger.record_cancel, run_id, outcome_json,
                              what="the ledger step record_cancel")
        except LedgerOrderError:
            raise
        except (LedgerError, OSError, sqlite3.Error) as exc:
            raise StepNotWritten(f"the ledger step record_cancel could not be written: "
                                 f"{exc}") from exc

    async def finished(self, run_id: str, outcome_json: str, turn: LaneTurn | None) -> None:
        """The ``finished`` step: the outcome to post is now in the outbox, with the
        lane's ``turn`` saved first in the same hand-off (``None``: the lane's session
        stays as it was).

        Never skipped (§7): the outcome must be in the outbox before it is posted, or
        a restart would report the run a second time, differently. So it is tried
        until it is written, again after 1 s, 2 s, … up to every 30 s while the disk
        refuses it (full, read-only, failing, hung past the bound), each failure
        logged. A step the ledger refuses as out of order (:class:`LedgerOrderError`)
        is logged and not tried again: no retry can change that answer.

        Cancelled: a write begun is finished or abandoned as in :meth:`_write`;
        between tries, at once. The step then stays unwritten, and the next start
        finds the run where the ledger has it (§7).
        """
        now = time.time()
        what = "the ledger step mark_finished"
        delay = RETRY_FIRST_S
        while True:
            try:
                await self._write(self._turn_then_finished, run_id, outcome_json, now, turn,
                                  what=what)
                return
            except LedgerOrderError as exc:
                log.error("ledger: %s", exc)
                return
            except (LedgerError, OSError, sqlite3.Error) as exc:
                log.error("ledger: %s could not be written (%s); the run waits and tries "
                          "again in %.0f s (is the disk full?)", what, exc, delay)
            await trio.sleep(delay)
            delay = min(delay * 2, RETRY_CAP_S)

    def _turn_then_finished(self, run_id: str, outcome_json: str, now: float,
                            turn: LaneTurn | None) -> None:
        """In the writer (or a worker) thread: the lane's session (not durable:
        queued first, it is in the ``finished`` commit or an earlier one, so
        finished ⇒ session kept), then ``finished`` (durable). One hop for both."""
        if turn is not None:
            try:
                self.ledger.save_turn(turn.lane, turn.account, turn.session_id, now,
                                      durable=False, totals=turn.totals)
            except Exception:
                log.exception("run %s: could not save the session of %s", run_id, turn.lane)
        self.ledger.mark_finished(run_id, outcome_json, now)

    async def reported(self, run_id: str, settlement: str) -> None:
        """``reported``, with how the report settled (or why there is none), not
        durable: lost only with the machine, and then the next start posts the saved
        outcome again, which the server answers 409 or 404 (§7). Queued from the trio
        thread for the ledger's writer when one is at work (no worker thread, no
        wait), else written in a worker thread without an fsync; a failure is logged.

        Cancelled: as :meth:`_write` (queuing never waits).
        """
        now = time.time()
        try:
            if self.ledger.mark_reported(run_id, settlement, now, durable=False,
                                         queue_only=True):
                return
        except LedgerError as exc:
            log.error("ledger: %s", exc)
            return
        await self._logged(functools.partial(self.ledger.mark_reported, durable=False),
                           run_id, settlement, now, what="the ledger step mark_reported")

    async def save_limits(self, limits: dict[str, float]) -> None:
        """Remember the accounts' usage limits (account → until, epoch s), so a
        restart need not find them again (§12); a failure is logged.
        Cancelled: as :meth:`_logged`."""
        await self._logged(self.ledger.save_account_limits, limits,
                           what="the ledger step save_account_limits")

    # -- start, drain and upkeep ------------------------------------------------------------

    async def unreported(self, what: str) -> UnreportedRuns:
        """Every run not reported yet, by state (a read that first waits for what is
        queued; ``what`` names the occasion in a timeout's message). Raises as
        :meth:`admit`. Cancelled: as :meth:`_read`."""
        return await self._read(self.ledger.recover, what=what)

    async def account_limits(self) -> dict[str, float]:
        """The accounts remembered at their limit, and until when (a read).
        Cancelled: as :meth:`_read`."""
        return await self._read(self.ledger.account_limits,
                                what="reading the accounts' limits at start")

    async def finished_since(self, since: float) -> list[tuple[float, str]]:
        """``(finished_at, outcome JSON)`` of every run finished since ``since``
        (epoch s), for today's spend (a read). Cancelled: as :meth:`_read`."""
        return await self._read(self.ledger.finished_since, since,
                                what="reading today's finished runs at start")

    async def lanes_last_used(self) -> dict[str, float]:
        """Each lane the ledger knows and when it last had a run (a read: see
        :meth:`~prohost.engine.ledger.Ledger.lanes_last_used`). Cancelled: as
        :meth:`_read`."""
        return await self._read(self.ledger.lanes_last_used,
                                what="reading when each conversation last had a run")

    async def close_unreadable(self, run_id: str, why: str) -> None:
        """Close a row whose body cannot be read any more (durable: it is met at
        start only), so that it is not met again. Raises as :meth:`admit`.
        Cancelled: as :meth:`_write`."""
        await self._write(self.ledger.mark_reported, run_id, f"unreadable: {why}",
                          time.time(), what=f"closing unreadable run {run_id}")

    async def prune(self, older_than_s: float) -> int:
        """Empty and forget reported runs older than ``older_than_s`` (§7); how many
        rows changed. Raises as :meth:`admit`. Cancelled: as :meth:`_write`."""
        return await self._write(self.ledger.prune, time.time(), older_than_s,
                                 what="pruning the ledger")

