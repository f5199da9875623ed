"""The ledger's operations: runs (admit, the steps, recover, prune), sessions per
lane and account, and remembered usage limits. See :mod:`prohost.engine.ledger`.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from types import TracebackType
from typing import Any

from prohost.engine.ledger.rows import (
    _ALLOWED,
    _COLUMNS,
    Admitted,
    LedgerError,
    LedgerOrderError,
    LedgerRow,
    RunState,
    UnreportedRuns,
    _row,
)
from prohost.engine.ledger.schema import (
    _BUSY_TIMEOUT_MS,
    FILE_MODE,
    LedgerUnavailable,
    _close_all,
    _connect,
    _make_private,
    _prepare,
    _sidecar,
)
from prohost.engine.ledger.sessions import SessionRows
from prohost.engine.ledger.writer import Settling
from prohost.engine.retention import KEEP_RUNS_S, KEEP_TOMBSTONES_S

log = logging.getLogger("prohost.ledger")



class AdmitTicket:
    """One ``admit`` call's claim on its ``accepted`` row, so that a delivery is never
    answered 503 while that row may still land (issue 27, point 3: a 503 tells the
    server to run it elsewhere, so it must mean "not recorded", for good — across a
    ``kill -9`` at any point too). Its fields are guarded by the ledger's queue
    lock; see :meth:`Ledger.withdraw_admits`."""

    __slots__ = ("done", "inserting", "now", "run_id", "withdrawn")

    def __init__(self, run_id: str, now: float) -> None:
        self.run_id = run_id
        self.now = now
        #: A 503 is on its way: the write, when applied, must not insert the row.
        self.withdrawn = False
        #: The write got past that check and inserts the row: from then on only the
        #: disk says whether it lands, so no 503 may be sent until it has said.
        self.inserting = False
        #: Settled: the write's transaction committed or failed, or the write was
        #: never applied. Whether the row landed is then read from the last commit
        #: (a row there may be an earlier delivery's, or reported: the answer
        #: depends on the row, not on this write).
        self.done = threading.Event()


class _AdmitWrite(Settling):
    """The write of :meth:`Ledger.admit`: inserts the run unless the ledger has it
    or the ticket was withdrawn first; told when it settled (:class:`Settling`)."""

    def __init__(self, ledger: Ledger, ticket: AdmitTicket, lane: str, body: str) -> None:
        self.ledger = ledger
        self.ticket = ticket
        self.lane = lane
        self.body = body

    def __call__(self, conn: sqlite3.Connection) -> Admitted:
        ticket = self.ticket
        run_id = ticket.run_id
        self.ledger._settling(self)  # (told when the write settles, whatever wraps this)
        found = conn.execute("SELECT state FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if found is not None:
            if RunState(found[0]) is RunState.REPORTED:
                return Admitted.REPORTED
            return Admitted.HELD
        # Decided under the queue lock, against withdraw_admits(): either a 503 was
        # decided first and nothing is inserted, or no 503 is sent until this
        # write's transaction has settled.
        with self.ledger._mu:
            if ticket.withdrawn:
                raise LedgerOrderError(
                    f"run {run_id!r} was withdrawn before it was recorded (its "
                    "delivery is answered 503)")
            ticket.inserting = True
        conn.execute(
            "INSERT INTO runs (run_id, lane, body, state, accepted_at) VALUES (?, ?, ?, ?, ?)",
            (run_id, self.lane, self.body, RunState.ACCEPTED.value, ticket.now),
        )
        return Admitted.NEW

    def settled(self) -> None:
        """(Under the queue lock.) Forget the ticket; wake whoever waits on it."""
        ticket = self.ticket
        waiting = self.ledger._admits.get(ticket.run_id, [])
        if ticket in waiting:
            waiting.remove(ticket)
        if not waiting:
            self.ledger._admits.pop(ticket.run_id, None)
        ticket.done.set()


class Ledger(SessionRows):
    """The on-disk ledger of runs and of agent sessions per lane.

    Open it with :meth:`open`; close it with :meth:`close` (or use it as a context
    manager). Every write is one savepoint in a group commit (see the module
    docstring): it is durable when the method returns, unless the method was called
    with ``durable=False``. Safe to call from any thread.
    """

    # -- opening ---------------------------------------------------------------------

    @classmethod
    def open(cls, path: Path) -> Ledger:
        """Open the ledger at ``path``, creating it (but not its folder) when missing.

        Raises :class:`LedgerError` when the file is not a ledger, was written by a
        newer prohost, or cannot be opened; the message names the file and what to do.
        """
        path = Path(path)
        try:
            _make_private(path)
        except OSError as exc:
            raise LedgerError(
                f"cannot create the run ledger {path}: {exc.strerror or exc}; check that "
                "its folder exists and is writable"
            ) from exc
        conn = _connect(path)
        reader: sqlite3.Connection | None = None
        try:
            _prepare(conn, path)
            # Opened once the schema is there; query_only: it can never write, so it
            # can never hold a write lock the writer would wait for.
            reader = _connect(path)
            reader.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
            reader.execute("PRAGMA query_only = ON")
            # sqlite gives -wal/-shm the database's mode; files left by an older
            # prohost (or another umask) are narrowed here too.
            for sidecar in (_sidecar(path, "-wal"), _sidecar(path, "-shm")):
                with suppress(FileNotFoundError):
                    os.chmod(sidecar, FILE_MODE)
        except OSError as exc:
            _close_all(conn, reader)
            raise LedgerError(
                f"cannot make the run ledger {path} private: {exc.strerror or exc}"
            ) from exc
        except sqlite3.Error as exc:
            _close_all(conn, reader)
            raise LedgerError(f"cannot open the run ledger {path}: {exc}") from exc
        except BaseException:
            _close_all(conn, reader)
            raise
        if reader is None:
            raise RuntimeError("prohost bug: the ledger's read connection was not opened")
        return cls(path, conn, reader)

    @classmethod
    def open_alone(cls, path: Path) -> Ledger:
        """Open an existing ledger on a disk with no room left for its shared-memory
        index (opening a WAL file creates ``-shm``, 32 KiB of new blocks): one
        connection, in sqlite's exclusive locking mode, keeps that index in this
        process's memory instead, and nothing else needs a new block until a write.
        So a harness started on a full disk comes up, answers 503 for what it cannot
        record, and records again once space returns (issue 27, point 8). Reads share
        that connection with the writes (they wait for a write under way) until the
        next start opens the file the usual way.

        Raises as :meth:`open`; a missing file is not created.
        """
        path = Path(path)
        if not path.exists():
            raise LedgerUnavailable(f"cannot open the run ledger {path}: it does not exist")
        conn = _connect(path)
        try:
            # Before the first read: only then does sqlite keep the WAL index in
            # memory (never creating -shm).
            conn.execute("PRAGMA locking_mode = EXCLUSIVE")
            _prepare(conn, path)
        except sqlite3.Error as exc:
            conn.close()
            raise LedgerError(f"cannot open the run ledger {path}: {exc}") from exc
        except BaseException:
            conn.close()
            raise
        return cls(path, conn, conn)

    def __enter__(self) -> Ledger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- runs ------------------------------------------------------------------------

    def admit(self, run_id: str, lane: str, body: str, now: float, *,
              ticket: AdmitTicket | None = None) -> Admitted:
        """Record a delivered run as accepted, unless its ``run_id`` is already here.

        Returns :attr:`Admitted.NEW` after the new row is durable (the ack may be sent
        then), :attr:`Admitted.HELD` when the run is in the ledger but not yet
        reported, :attr:`Admitted.REPORTED` when it has been reported. Never inserts a
        ``run_id`` twice.

        Until it settles, the call's ``ticket`` (one is made when none is given) is
        what :meth:`withdraw_admits` finds: a write withdrawn before it is applied
        raises :class:`LedgerOrderError` and inserts nothing.
        """
        if ticket is None:
            ticket = AdmitTicket(run_id, now)
        write = _AdmitWrite(self, ticket, lane, body)
        self.expect_admit(ticket)
        try:
            admission: Admitted = self._write(write, what="admit")
        except BaseException:
            with self._mu:
                if not ticket.inserting:
                    # Failed or refused without inserting: nothing to wait for.
                    ticket.withdrawn = True
                    write.settled()
            raise
        return admission

    def expect_admit(self, ticket: AdmitTicket) -> None:
        """Make ``ticket``'s ``admit`` known to :meth:`withdraw_admits` from now on,
        before the call is made (a job for the writer thread makes it later, maybe
        after a 503 for its run was decided). Idempotent; never blocks on I/O."""
        with self._mu:
            if ticket.done.is_set() or ticket.withdrawn:
                return
            waiting = self._admits.setdefault(ticket.run_id, [])
            if ticket not in waiting:
                waiting.append(ticket)

    def withdraw_admits(self, run_id: str) -> list[AdmitTicket]:
        """Before a 503 for ``run_id``: make sure no ``accepted`` row of it can land
        unseen. Never blocks on I/O (the trio thread may call it).

        Every ``admit`` of the run not yet applied (queued behind a hung write, or
        given up on by a caller whose connection dropped) is withdrawn: it inserts
        nothing when applied. Airtight, since nothing was written, so no crash can
        bring a row back. Returns the others: admits whose write is inserting the
        row in a transaction not settled yet. While any is returned, no 503 may be
        sent — that row may still land, and nothing written after it could be
        relied on to take it back (the disk that hangs is the one it would be
        written to, and a ``kill -9`` can come first). Wait for each
        (``ticket.done``), then read the last commit: a row there is answered
        200 (or 204); none, and a 503 is safe.
        """
        with self._mu:
            under_way = []
            for ticket in self._admits.pop(run_id, []):
                if ticket.inserting:
                    under_way.append(ticket)
                else:
                    ticket.withdrawn = True  # forgotten: it can only fail now
            if under_way:
                self._admits[run_id] = list(under_way)
            return under_way

    def committed(self, run_id: str) -> LedgerRow | None:
        """The run's row as last committed, or ``None`` — without waiting for what is
        queued (reads never wait behind a write: issue 27, point 6)."""
        with self._locked() as conn:
            found = conn.execute(
                f"SELECT {_COLUMNS} FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
        return None if found is None else _row(found)

    def get(self, run_id: str) -> LedgerRow | None:
        """The run's row, or ``None`` when the ledger does not hold it (never, or pruned).

        Sees every write made before the call, also those made with ``durable=False``.
        """
        self._flush()
        with self._locked() as conn:
            found = conn.execute(
                f"SELECT {_COLUMNS} FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
        return None if found is None else _row(found)

    def body(self, run_id: str) -> str | None:
        """The run's body as it was delivered, or ``None`` when the ledger does not hold it.

        No flush: the body is written by ``admit``, which waits for its fsync, so
        the last commit has it (a queued run's body is read from here as it starts).
        """
        with self._locked() as conn:
            found = conn.execute("SELECT body FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return None if found is None or found[0] is None else str(found[0])

    def mark_started(self, run_id: str, now: float, *, durable: bool = True) -> None:
        """Record that the agent is about to be spawned (only from ``accepted``)."""
        self._advance(run_id, RunState.STARTED, "started_at = ?", (now,), durable=durable)

    def record_pgid(self, run_id: str, pgid: int, start_state: str | None = None) -> None:
        """Record the spawned agent's process group (only while ``started``), and with
        it ``start_state``, what the run's checkouts were as it began, when given (a
        later attempt's group keeps the first attempt's: the run began once).

        Durable, and the harness waits for it before it reads the agent's output:
        a restart after a ``kill -9`` can only kill a group that was written (§7),
        and can only say what the run changed when it knows where it began.
        """

        def write(conn: sqlite3.Connection) -> None:
            state = self._state_of(conn, run_id)
            if state is not RunState.STARTED:
                raise LedgerError(
                    f"harness bug: record_pgid({run_id!r}) on a run that is {state.value}, "
                    "not started"
                )
            conn.execute("UPDATE runs SET pgid = ?, start_state = COALESCE(start_state, ?) "
                         "WHERE run_id = ?", (pgid, start_state, run_id))

        self._write(write, what="record_pgid")

    def record_cancel(self, run_id: str, outcome_json: str) -> None:
        """Keep a server's cancel (``Outcome.to_json`` text) of a run not finished yet,
        before its agent is stopped (§6): a restart after a ``kill -9`` reports the
        run cancelled (not ``restarted``, retryable) and never starts it again. The
        state does not move; ``finished`` replaces the outcome with the whole one.
        A run already finished keeps its own (a cancel after the agent ended)."""

        def write(conn: sqlite3.Connection) -> None:
            state = self._state_of(conn, run_id)
            if state in (RunState.ACCEPTED, RunState.STARTED):
                conn.execute("UPDATE runs SET outcome = ? WHERE run_id = ?",
                             (outcome_json, run_id))

        self._write(write, what="record_cancel")

    def mark_finished(
        self, run_id: str, outcome_json: str, now: float, *, durable: bool = True
    ) -> None:
        """Save the outcome to post (``Outcome.to_json`` text); the run is now in the outbox.

        Allowed from ``started``, and from ``accepted`` for a queued run that was
        cancelled or drained before it started.
        """
        self._advance(
            # The start state only served a restart's report; the outcome has its changes.
            run_id, RunState.FINISHED, "finished_at = ?, outcome = ?, start_state = NULL",
            (now, outcome_json),
            durable=durable,
        )

    def mark_reported(
        self, run_id: str, settlement: str, now: float, *, durable: bool = True,
        queue_only: bool = False,
    ) -> bool:
        """Record that the run's report settled (or that it is dropped without one).

        Allowed from any earlier state. ``settlement`` says how, for people reading it.
        The harness passes ``durable=False`` once a report settled (see the module
        docstring).

        ``queue_only`` (with ``durable=False``; for the trio thread): when a writer is
        at work, queue the write for it and return True at once — no worker thread,
        no waiting on I/O, the write rides that writer's next commit as a
        ``durable=False`` call would; when none is, queue nothing and return False
        (then call again without it, in a worker thread). Returns True otherwise.
        """
        write = self._advance_write(
            run_id, RunState.REPORTED, "reported_at = ?, settlement = ?", (now, settlement))
        if queue_only:
            return self._queue_only(durable, write, what="mark_reported")
        self._write(write, what="mark_reported", durable=durable)
        return True

    def recover(self) -> UnreportedRuns:
        """Classify every run not yet reported, for a start after a crash (§7).

        Sees every write made before the call, also those made with ``durable=False``
        (a drain asks this to find what is still unreported).
        """
        self._flush()
        with self._locked() as conn:
            rows = [
                _row(values)
                for values in conn.execute(
                    f"SELECT {_COLUMNS} FROM runs WHERE state != ? ORDER BY seq",
                    (RunState.REPORTED.value,),
                )
            ]
        return UnreportedRuns(
            pending=[row for row in rows if row.state is RunState.ACCEPTED],
            interrupted=[row for row in rows if row.state is RunState.STARTED],
            outbox=[row for row in rows if row.state is RunState.FINISHED],
        )

    def prune(
        self,
        now: float,
        older_than_s: float = KEEP_RUNS_S,
        forget_after_s: float = KEEP_TOMBSTONES_S,
    ) -> int:
        """Empty reported runs older than ``older_than_s``; forget them after ``forget_after_s``.

        Ages are counted back from ``now`` (s since the epoch) to when the run was
        reported. An emptied run keeps only its tombstone — run id, state and when
        it was reported; its lane, body, outcome and settlement are gone — so
        :meth:`admit` still answers :attr:`Admitted.REPORTED` for it. Runs not yet
        reported are never touched. Returns how many rows were emptied or deleted.
        """
        forget_after_s = max(forget_after_s, older_than_s)

        def write(conn: sqlite3.Connection) -> int:
            deleted = conn.execute(
                "DELETE FROM runs WHERE state = ? AND reported_at < ?",
                (RunState.REPORTED.value, now - forget_after_s),
            ).rowcount
            emptied = conn.execute(
                "UPDATE runs SET lane = '', body = '', outcome = NULL, settlement = NULL, "
                "start_state = NULL "
                "WHERE state = ? AND reported_at < ? AND body != ''",
                (RunState.REPORTED.value, now - older_than_s),
            ).rowcount
            # A session untouched this long is not resumed by anyone counting on it.
            conn.execute("DELETE FROM session_usage WHERE updated_at < ?",
                         (now - forget_after_s,))
            return int(emptied + deleted)

        changed: int = self._write(write, what="prune")
        return changed

    # -- internals -------------------------------------------------------------------

    def _queue_only(self, durable: bool, write: Callable[[sqlite3.Connection], None], *,
                    what: str) -> bool:
        if durable:
            raise LedgerError(f"harness bug: {what}(queue_only=True) needs durable=False: "
                              "a durable write waits for its commit")
        return self._queue_behind_writer(write, what=what)

    def _advance(
        self, run_id: str, target: RunState, assignments: str, values: tuple[Any, ...],
        *, durable: bool = True,
    ) -> None:
        self._write(self._advance_write(run_id, target, assignments, values),
                    what=f"mark_{target.value}", durable=durable)

    def _advance_write(
        self, run_id: str, target: RunState, assignments: str, values: tuple[Any, ...],
    ) -> Callable[[sqlite3.Connection], None]:
        """The write that moves ``run_id`` to ``target`` (refused unless allowed)."""

        def write(conn: sqlite3.Connection) -> None:
            state = self._state_of(conn, run_id)
            if state not in _ALLOWED[target]:
                # Staying put is refused too: it would overwrite the recorded step.
                raise LedgerOrderError(
                    f"harness bug: run {run_id!r} cannot move from {state.value} to "
                    f"{target.value} (a run's state only moves forward)"
                )
            conn.execute(
                f"UPDATE runs SET state = ?, {assignments} WHERE run_id = ?",
                (target.value, *values, run_id),
            )

        return write

    @staticmethod
    def _state_of(conn: sqlite3.Connection, run_id: str) -> RunState:
        found = conn.execute("SELECT state FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if found is None:
            raise LedgerOrderError(f"harness bug: run {run_id!r} is not in the ledger")
        return RunState(found[0])
