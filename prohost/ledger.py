"""The run ledger: every run's life on disk, so nothing is run twice and nothing is lost.

PROTOCOL.md §3 and §7. A run is written ``accepted`` (with its signed body) before its
delivery is acked, ``started`` just before its agent is spawned, ``finished`` with the
outcome to post (the ledger is the outbox), and ``reported`` once the report settled.
After a crash or ``kill -9`` the next start can tell exactly what to do with every run
(:meth:`Ledger.recover`), and a redelivery of a run already in the ledger is never
executed again (:meth:`Ledger.admit`).

The same file keeps the agent session each lane last ended with, so a conversation's
next turn resumes it across restarts.

Group commit. Every write is a function of the write connection, queued; one caller
at a time is the *writer*: it takes every write waiting at that moment, applies them
in one ``BEGIN IMMEDIATE … COMMIT`` (each inside its own ``SAVEPOINT``, so a write that
fails — a harness bug, a constraint — fails only its own caller), and wakes each
caller once the commit is done. The writer is simply the first caller that finds no
writer at work (a worker thread of ``trio.to_thread``); when it is done it hands the
role to the first waiting caller, whose write the next batch carries. So one write
at a time costs one transaction, as it always did, and 16 busy lanes share one
commit instead of queueing for 16. Reads go to a second connection (WAL lets it read
the last commit while a write is under way) and never queue behind writes.

Durable (``synchronous=FULL``: the commit fsyncs the WAL) or not. A batch that holds a
durable write is committed with ``FULL``; a batch of only non-durable writes with
``NORMAL``, which writes the WAL without an fsync. Such a commit survives the death of
the process (``kill -9``, a crash: the pages are the kernel's), and is lost only when
the machine itself goes down before the next fsync — and every later durable commit
fsyncs it too, since the WAL is one file written in order. A non-durable caller does
not wait for a commit already under way: it returns once its write is queued for the
next one (errors are then logged, not raised).

Each step of a run, and whether the harness waits for its fsync before going on:

=================  =========  ========================================================
step               durable    why
=================  =========  ========================================================
``admit``          yes        the ack promises the run survives a crash (§3, §7)
``mark_started``   yes        before the spawn: a run found ``accepted`` after a crash
                              is run again, so a spawned one must never look so
``record_pgid``    no         only used to kill an agent that outlived its harness;
                              it survives a harness crash (the agent's only way to
                              outlive one); lost with the machine, the agent is too
``save_session``   no         written just before ``mark_finished``, so it is in that
                              commit (or an earlier one): finished ⇒ session kept
``mark_finished``  yes        the outcome is the outbox: durable before the POST
``mark_reported``  no         lost only with the machine; the next start then posts the
                              saved outcome again, which the server answers 409 (§7)
``prune``          yes        rare; nothing waits on it
=================  =========  ========================================================

(``mark_reported`` from :mod:`prohost.harness`, closing an unreadable row, stays durable:
it is met at start only.) So a run costs three fsync'd steps, shared with whatever other
runs are writing at the same moment, where it used to cost six.

The file and its ``-wal``/``-shm`` are mode 0600 whatever the umask: they hold run
bodies, MCP tokens and conversation text.

:class:`Ledger` is synchronous; the harness calls it through
:meth:`prohost.blocking.Bounds.run`, from any number of worker threads. A call on a
hung disk is abandoned after its bound, and that is safe: the call's write stays in
the queue (or in the batch under way) and the writer applies it whenever the disk
answers — writes are whole transactions, so the file stays consistent — while the
abandoned caller's thread waits at most :data:`LOCK_WAIT_S` and then gives up; the
step's durability is merely unknown, and the next start reads the ledger (§7) and
reports whatever it finds. Nobody else touches the write connection meanwhile: a
later writer waits for it at most :data:`LOCK_WAIT_S`, then fails every write it
holds with :class:`LedgerError`.

Retention (the exactly-once window): a reported run keeps its body and outcome for
7 days (:data:`KEEP_BODIES_S`); then :meth:`Ledger.prune` empties them, leaving a
tombstone — run id, state and when it was reported — for 30 days after the report
(:data:`KEEP_TOMBSTONES_S`). Any redelivery within those 30 days is answered 204 and
never runs. A redelivery later than that is executed again: the server must not
redeliver a run it has seen reported for a month.
"""

from __future__ import annotations

import enum
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import attrs

from prohost.accounts import DEFAULT_ACCOUNT

__all__ = [
    "Admission",
    "Ledger",
    "LedgerError",
    "LedgerRow",
    "LedgerStatistics",
    "Recovery",
    "RunState",
]

log = logging.getLogger("prohost.ledger")

SCHEMA_VERSION = 2
"""The ``PRAGMA user_version`` this code writes and reads."""

# Each entry migrates from version ``index`` to ``index + 1``; a later version appends
# its statements here and bumps SCHEMA_VERSION, and existing ledgers are upgraded in
# one transaction on open.
_MIGRATIONS: list[list[str]] = [
    [
        # seq is the accept order. AUTOINCREMENT (not the rowid default) so a number is
        # never reused after prune deletes the newest rows: accept order stays monotonic
        # for the life of the file.
        """
        CREATE TABLE runs (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            run_id TEXT NOT NULL UNIQUE,
            lane TEXT NOT NULL,
            body TEXT NOT NULL,
            state TEXT NOT NULL
                CHECK (state IN ('accepted', 'started', 'finished', 'reported')),
            accepted_at REAL NOT NULL,
            started_at REAL,
            pgid INTEGER,
            finished_at REAL,
            outcome TEXT,
            reported_at REAL,
            settlement TEXT
        )
        """,
        "CREATE INDEX runs_by_state ON runs (state, seq)",
        """
        CREATE TABLE sessions (
            lane TEXT PRIMARY KEY,
            session_id TEXT NOT NULL,
            updated_at REAL NOT NULL
        )
        """,
    ],
    [
        # Accounts (PROTOCOL.md §12). The `sessions` table above stays the implicit
        # default account's, as it was before accounts existed; a named account's
        # sessions are kept per lane AND account, so a lane that moves to another
        # account and back finds its old session there again.
        """
        CREATE TABLE account_sessions (
            lane TEXT NOT NULL,
            account TEXT NOT NULL,
            session_id TEXT NOT NULL,
            updated_at REAL NOT NULL,
            PRIMARY KEY (lane, account)
        )
        """,
        # The account each lane's last turn used: it keeps it while usable.
        """
        CREATE TABLE lane_accounts (
            lane TEXT PRIMARY KEY,
            account TEXT NOT NULL,
            updated_at REAL NOT NULL
        )
        """,
        # Accounts at their usage limit and until when (epoch s), so a restart does
        # not spend a run on an account it already knows is refusing work.
        """
        CREATE TABLE account_limits (
            account TEXT PRIMARY KEY,
            limited_until REAL NOT NULL
        )
        """,
    ],
]
if len(_MIGRATIONS) != SCHEMA_VERSION:
    raise RuntimeError("prohost bug: the ledger's migrations do not match SCHEMA_VERSION")

#: How long a write waits for another connection's lock before failing (ms). Only one
#: harness uses a ledger (home.py holds the single-instance lock), so waiting this long
#: means something else has the file open.
_BUSY_TIMEOUT_MS = 5000

#: How long a call waits for the ledger's own lock (s) before it gives up with a
#: LedgerError. The lock is only held that long by a step whose thread the harness
#: abandoned on a hung disk (prohost.blocking); waiting forever would pile up threads.
LOCK_WAIT_S = 30.0

#: How long :meth:`Ledger.close` waits for the lock (s). By then nothing but a step
#: abandoned on a hung disk can hold it, and the process is about to exit.
CLOSE_WAIT_S = 2.0

#: Reported runs keep their body and outcome this long (s): for people reading the
#: ledger, and for `prohost agent status`.
KEEP_BODIES_S = 7 * 86400.0
#: Reported runs keep a tombstone (run id, state, when reported) this long (s), so a
#: late redelivery is still answered 204 and never run twice.
KEEP_TOMBSTONES_S = 30 * 86400.0

#: Mode of the ledger file and its -wal/-shm (octal): they hold run bodies, MCP tokens
#: and conversation text.
FILE_MODE = 0o600


class LedgerError(Exception):
    """The ledger cannot be used, or a caller asked for something impossible.

    Raised for a file that is not a ledger, one written by a newer prohost, a disk or
    sqlite failure, and for harness bugs: an unknown ``run_id`` or a state change that
    would move a run backwards.
    """


class RunState(enum.StrEnum):
    """Where a run is in its life; it only ever moves forward through these."""

    ACCEPTED = "accepted"
    STARTED = "started"
    FINISHED = "finished"
    REPORTED = "reported"


# The moves a run may make. A queued run cancelled before it starts goes straight to
# FINISHED (its outcome still has to be posted); a run dropped without a report
# (heartbeat_ack.unknown) goes to REPORTED from wherever it is.
_ALLOWED: dict[RunState, frozenset[RunState]] = {
    RunState.STARTED: frozenset({RunState.ACCEPTED}),
    RunState.FINISHED: frozenset({RunState.ACCEPTED, RunState.STARTED}),
    RunState.REPORTED: frozenset({RunState.ACCEPTED, RunState.STARTED, RunState.FINISHED}),
}


@attrs.frozen
class LedgerRow:
    """One run as the ledger holds it."""

    run_id: str
    lane: str
    body: str
    """The delivery's raw body text, exactly as it was signed."""
    state: RunState
    seq: int
    """Accept order: larger was accepted later. A counter, never the wall clock."""
    accepted_at: float
    started_at: float | None
    pgid: int | None
    """The agent's process group, once spawned (see :mod:`prohost.procinfo`)."""
    outcome: str | None
    """The outcome to post, as ``prohost.runs.Outcome.to_json`` text, once finished."""
    reported_at: float | None
    settlement: str | None
    """How the report settled (free text, for people)."""
    finished_at: float | None = None


class Admission(enum.Enum):
    """What :meth:`Ledger.admit` found, which decides the delivery's ack (§3)."""

    NEW = "new"
    """Not seen before; now recorded as accepted. Ack 200 and queue it."""
    HELD = "held"
    """Already in the ledger and not yet reported. Ack 200; do not queue it again."""
    REPORTED = "reported"
    """Already reported. Ack 204."""


@attrs.frozen
class Recovery:
    """What a start after a crash finds in the ledger (§7), each list in accept order."""

    pending: list[LedgerRow]
    """Accepted, never started: run them again, in this order."""
    interrupted: list[LedgerRow]
    """Started, not finished: never run again; kill a surviving agent, report a retryable
    failure."""
    outbox: list[LedgerRow]
    """Finished, not reported: post the saved outcome."""


_COLUMNS = (
    "run_id, lane, body, state, seq, accepted_at, started_at, pgid, outcome, "
    "reported_at, settlement, finished_at"
)


def _row(values: tuple[Any, ...]) -> LedgerRow:
    (run_id, lane, body, state, seq, accepted_at, started_at, pgid, outcome,
     reported_at, settlement, finished_at) = values
    return LedgerRow(
        run_id=run_id,
        lane=lane,
        body=body,
        state=RunState(state),
        seq=seq,
        accepted_at=accepted_at,
        started_at=started_at,
        pgid=pgid,
        outcome=outcome,
        reported_at=reported_at,
        settlement=settlement,
        finished_at=finished_at,
    )


@attrs.frozen
class LedgerStatistics:
    """Counters of one open ledger, for benchmarks and tests."""

    queued: int
    """Writes waiting for a writer now."""
    writes: int
    """Writes settled (committed, or failed) since the ledger was opened."""
    commits: int
    """Transactions committed by the writer (every batch is one)."""
    durable_commits: int
    """Of those, commits with ``synchronous=FULL``: one fsync of the WAL each."""


_T = TypeVar("_T")


class _Write:
    """One queued write: a function of the write connection, and what came of it.

    Every field is guarded by the ledger's queue lock, except that the writer fills
    ``result``/``error`` of the writes in its batch before it sets ``done``.
    """

    __slots__ = ("done", "durable", "error", "fn", "lead", "result", "waits", "wake", "what")

    def __init__(self, fn: Callable[[sqlite3.Connection], Any], what: str, *,
                 durable: bool, waits: bool) -> None:
        self.fn = fn
        self.what = what
        self.durable = durable
        #: A caller is waiting for this write (and will take the writer's role when
        #: it is handed over); a write nobody waits for is the writer's to apply.
        self.waits = waits
        self.done = False
        #: Set by a writer that hands its role to this write's caller.
        self.lead = False
        self.result: Any = None
        self.error: LedgerError | None = None
        self.wake = threading.Event() if waits else None


def _nothing(conn: sqlite3.Connection) -> None:
    """The write of a flush: it only waits for every write queued before it."""


class Ledger:
    """The on-disk ledger of runs and of agent sessions per lane.

    Open it with :meth:`open`; close it with :meth:`close` (or use it as a context
    manager). Every write is one savepoint in a group commit (see the module
    docstring): it is durable when the method returns, unless the method was called
    with ``durable=False``. Safe to call from any thread.
    """

    def __init__(self, path: Path, conn: sqlite3.Connection,
                 reader: sqlite3.Connection) -> None:
        """Use :meth:`open`."""
        self.path = path
        #: The write connection; only the holder of ``_lock`` uses it.
        self._conn: sqlite3.Connection | None = conn
        self._lock = threading.Lock()
        #: The read connection (WAL: reads the last commit, never waits for a write);
        #: only the holder of ``_read_lock`` uses it.
        self._reader: sqlite3.Connection | None = reader
        self._read_lock = threading.Lock()
        #: Guards the queue and the fields below; never held across I/O.
        self._mu = threading.Lock()
        self._queue: list[_Write] = []
        #: A caller is the writer (applying batches, or about to).
        self._writing = False
        self._closed = False
        self._synchronous_full = True  # what _prepare set on the write connection
        self._writes = 0
        self._commits = 0
        self._durable_commits = 0

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

    def close(self) -> None:
        """Apply the writes still queued, fsync them, and close the file.

        Further calls raise :class:`LedgerError`; closing twice is fine. When the
        write connection is still busy after :data:`CLOSE_WAIT_S` (a step abandoned
        on a hung disk), the file is left to the process's exit (logged), so a hung
        disk cannot hold the exit either.
        """
        if not self._lock.acquire(timeout=CLOSE_WAIT_S):
            log.warning("the run ledger %s is still busy with a step that never finished; "
                        "leaving it open for the process exit to close", self.path)
            return
        try:
            with self._mu:
                # Later writes are refused; a writer waiting for the connection finds
                # the queue empty (its write is applied here) and goes.
                self._closed = True
                left, self._queue = self._queue, []
            if left and self._conn is not None:
                # Durable: a clean exit leaves nothing to the next fsync.
                self._apply(left, force_durable=True)
            else:
                self._settle(left, closed=True)
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        finally:
            self._lock.release()
        if self._read_lock.acquire(timeout=CLOSE_WAIT_S):
            try:
                if self._reader is not None:
                    self._reader.close()
                    self._reader = None
            finally:
                self._read_lock.release()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def statistics(self) -> LedgerStatistics:
        """The ledger's counters now (see :class:`LedgerStatistics`)."""
        with self._mu:
            return LedgerStatistics(
                queued=len(self._queue),
                writes=self._writes,
                commits=self._commits,
                durable_commits=self._durable_commits,
            )

    # -- runs ------------------------------------------------------------------------

    def admit(self, run_id: str, lane: str, body: str, now: float) -> Admission:
        """Record a delivered run as accepted, unless its ``run_id`` is already here.

        Returns :attr:`Admission.NEW` after the new row is durable (the ack may be sent
        then), :attr:`Admission.HELD` when the run is in the ledger but not yet
        reported, :attr:`Admission.REPORTED` when it has been reported. Never inserts a
        ``run_id`` twice.
        """

        def write(conn: sqlite3.Connection) -> Admission:
            found = conn.execute("SELECT state FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if found is not None:
                if RunState(found[0]) is RunState.REPORTED:
                    return Admission.REPORTED
                return Admission.HELD
            conn.execute(
                "INSERT INTO runs (run_id, lane, body, state, accepted_at) VALUES (?, ?, ?, ?, ?)",
                (run_id, lane, body, RunState.ACCEPTED.value, now),
            )
            return Admission.NEW

        admission: Admission = self._write(write, what="admit")
        return admission

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

    def mark_started(self, run_id: str, now: float, *, durable: bool = True) -> None:
        """Record that the agent is about to be spawned (only from ``accepted``)."""
        self._advance(run_id, RunState.STARTED, "started_at = ?", (now,), durable=durable)

    def record_pgid(self, run_id: str, pgid: int, *, durable: bool = True) -> None:
        """Record the spawned agent's process group (only while ``started``).

        The harness passes ``durable=False`` (see the module docstring).
        """

        def write(conn: sqlite3.Connection) -> None:
            state = self._state_of(conn, run_id)
            if state is not RunState.STARTED:
                raise LedgerError(
                    f"harness bug: record_pgid({run_id!r}) on a run that is {state.value}, "
                    "not started"
                )
            conn.execute("UPDATE runs SET pgid = ? WHERE run_id = ?", (pgid, run_id))

        self._write(write, what="record_pgid", durable=durable)

    def mark_finished(
        self, run_id: str, outcome_json: str, now: float, *, durable: bool = True
    ) -> None:
        """Save the outcome to post (``Outcome.to_json`` text); the run is now in the outbox.

        Allowed from ``started``, and from ``accepted`` for a queued run that was
        cancelled or drained before it started.
        """
        self._advance(
            run_id, RunState.FINISHED, "finished_at = ?, outcome = ?", (now, outcome_json),
            durable=durable,
        )

    def mark_reported(
        self, run_id: str, settlement: str, now: float, *, durable: bool = True
    ) -> None:
        """Record that the run's report settled (or that it is dropped without one).

        Allowed from any earlier state. ``settlement`` says how, for people reading it.
        The harness passes ``durable=False`` once a report settled (see the module
        docstring).
        """
        self._advance(
            run_id, RunState.REPORTED, "reported_at = ?, settlement = ?", (now, settlement),
            durable=durable,
        )

    def recover(self) -> Recovery:
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
        return Recovery(
            pending=[row for row in rows if row.state is RunState.ACCEPTED],
            interrupted=[row for row in rows if row.state is RunState.STARTED],
            outbox=[row for row in rows if row.state is RunState.FINISHED],
        )

    def prune(
        self,
        now: float,
        older_than_s: float = KEEP_BODIES_S,
        forget_after_s: float = KEEP_TOMBSTONES_S,
    ) -> int:
        """Empty reported runs older than ``older_than_s``; forget them after ``forget_after_s``.

        Ages are counted back from ``now`` (s since the epoch) to when the run was
        reported. An emptied run keeps only its tombstone — run id, state and when
        it was reported; its lane, body, outcome and settlement are gone — so
        :meth:`admit` still answers :attr:`Admission.REPORTED` for it. Runs not yet
        reported are never touched. Returns how many rows were emptied or deleted.
        """
        forget_after_s = max(forget_after_s, older_than_s)

        def write(conn: sqlite3.Connection) -> int:
            deleted = conn.execute(
                "DELETE FROM runs WHERE state = ? AND reported_at < ?",
                (RunState.REPORTED.value, now - forget_after_s),
            ).rowcount
            emptied = conn.execute(
                "UPDATE runs SET lane = '', body = '', outcome = NULL, settlement = NULL "
                "WHERE state = ? AND reported_at < ? AND body != ''",
                (RunState.REPORTED.value, now - older_than_s),
            ).rowcount
            return int(emptied + deleted)

        changed: int = self._write(write, what="prune")
        return changed

    # -- sessions --------------------------------------------------------------------

    def session_for(self, lane: str) -> str | None:
        """The agent session the lane's last turn ended with, if any.

        Read at once, never behind a write under way: it sees every commit made so
        far. (A turn's ``save_session`` is queued before that turn's
        ``mark_finished``, and the lane's next turn starts after that returned.)
        """
        with self._locked() as conn:
            found = conn.execute(
                "SELECT session_id FROM sessions WHERE lane = ?", (lane,)
            ).fetchone()
        return None if found is None else str(found[0])

    def save_session(
        self, lane: str, session_id: str | None, now: float, *, durable: bool = True
    ) -> None:
        """Remember the lane's session for its next turn; ``None`` forgets it.

        The harness passes ``durable=False``, just before the turn's ``mark_finished``
        (see the module docstring).
        """

        def write(conn: sqlite3.Connection) -> None:
            if session_id is None:
                conn.execute("DELETE FROM sessions WHERE lane = ?", (lane,))
            else:
                conn.execute(
                    "INSERT INTO sessions (lane, session_id, updated_at) VALUES (?, ?, ?) "
                    "ON CONFLICT (lane) DO UPDATE SET "
                    "session_id = excluded.session_id, updated_at = excluded.updated_at",
                    (lane, session_id, now),
                )

        self._write(write, what="save_session", durable=durable)

    # -- accounts (PROTOCOL.md §12) -------------------------------------------------

    def account_session(self, lane: str, account: str) -> str | None:
        """The session the lane's last turn on ``account`` ended with, if any."""
        with self._locked() as conn:
            if account == DEFAULT_ACCOUNT:
                found = conn.execute(
                    "SELECT session_id FROM sessions WHERE lane = ?", (lane,)).fetchone()
            else:
                found = conn.execute(
                    "SELECT session_id FROM account_sessions WHERE lane = ? AND account = ?",
                    (lane, account)).fetchone()
        return None if found is None else str(found[0])

    def lane_account(self, lane: str) -> str | None:
        """The account the lane's last turn used, if any."""
        with self._locked() as conn:
            found = conn.execute(
                "SELECT account FROM lane_accounts WHERE lane = ?", (lane,)).fetchone()
        return None if found is None else str(found[0])

    def save_turn(
        self, lane: str, account: str, session_id: str | None, now: float, *,
        durable: bool = True,
    ) -> None:
        """Remember the session the lane's turn on ``account`` ended with (``None``
        forgets it) and that ``account`` is the lane's account now, in one step.

        The harness passes ``durable=False``, just before the turn's ``mark_finished``,
        like :meth:`save_session` (see the module docstring).
        """

        def write(conn: sqlite3.Connection) -> None:
            if account == DEFAULT_ACCOUNT:
                if session_id is None:
                    conn.execute("DELETE FROM sessions WHERE lane = ?", (lane,))
                else:
                    conn.execute(
                        "INSERT INTO sessions (lane, session_id, updated_at) VALUES (?, ?, ?) "
                        "ON CONFLICT (lane) DO UPDATE SET "
                        "session_id = excluded.session_id, updated_at = excluded.updated_at",
                        (lane, session_id, now),
                    )
            elif session_id is None:
                conn.execute("DELETE FROM account_sessions WHERE lane = ? AND account = ?",
                             (lane, account))
            else:
                conn.execute(
                    "INSERT INTO account_sessions (lane, account, session_id, updated_at) "
                    "VALUES (?, ?, ?, ?) ON CONFLICT (lane, account) DO UPDATE SET "
                    "session_id = excluded.session_id, updated_at = excluded.updated_at",
                    (lane, account, session_id, now),
                )
            conn.execute(
                "INSERT INTO lane_accounts (lane, account, updated_at) VALUES (?, ?, ?) "
                "ON CONFLICT (lane) DO UPDATE SET "
                "account = excluded.account, updated_at = excluded.updated_at",
                (lane, account, now),
            )

        self._write(write, what="save_turn", durable=durable)

    def account_limits(self) -> dict[str, float]:
        """Every account remembered as limited, and until when (epoch s)."""
        with self._locked() as conn:
            return {str(name): float(until) for name, until in conn.execute(
                "SELECT account, limited_until FROM account_limits")}

    def save_account_limits(self, limits: dict[str, float]) -> None:
        """Replace the remembered limits with ``limits`` (account → until, epoch s)."""

        def write(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM account_limits")
            conn.executemany(
                "INSERT INTO account_limits (account, limited_until) VALUES (?, ?)",
                sorted(limits.items()),
            )

        self._write(write, what="save_account_limits")

    # -- internals -------------------------------------------------------------------

    def _advance(
        self, run_id: str, target: RunState, assignments: str, values: tuple[Any, ...],
        *, durable: bool = True,
    ) -> None:
        def write(conn: sqlite3.Connection) -> None:
            state = self._state_of(conn, run_id)
            if state not in _ALLOWED[target]:
                # Staying put is refused too: it would overwrite the recorded step.
                raise LedgerError(
                    f"harness bug: run {run_id!r} cannot move from {state.value} to "
                    f"{target.value} (a run's state only moves forward)"
                )
            conn.execute(
                f"UPDATE runs SET state = ?, {assignments} WHERE run_id = ?",
                (target.value, *values, run_id),
            )

        self._write(write, what=f"mark_{target.value}", durable=durable)

    @staticmethod
    def _state_of(conn: sqlite3.Connection, run_id: str) -> RunState:
        found = conn.execute("SELECT state FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if found is None:
            raise LedgerError(f"harness bug: run {run_id!r} is not in the ledger")
        return RunState(found[0])

    # -- the group commit --------------------------------------------------------------

    def _write(
        self, fn: Callable[[sqlite3.Connection], _T], *, what: str, durable: bool = True,
        waits: bool | None = None,
    ) -> _T:
        """Queue ``fn`` for the writer; with ``waits`` (the default when ``durable``),
        return its result once it is committed, or raise its error.

        Without waiting, return ``None`` (typed ``_T`` for the caller's convenience;
        no caller that does not wait reads it) as soon as the write is queued behind a
        writer at work, or once it is committed (without an fsync) when there was none.
        """
        if waits is None:
            waits = durable
        write = _Write(fn, what, durable=durable, waits=waits)
        # The first caller to find no writer at work is the writer; a waiting caller
        # may be handed the role by the writer before it.
        if self._enqueue(write) or (waits and not self._wait_for(write)):
            self._lead()
        if not waits:
            return None  # type: ignore[return-value]  # its errors were logged
        if not write.done:
            raise LedgerError(f"prohost bug: the ledger's {what} returned before its "
                              "write was applied")
        if write.error is not None:
            raise write.error
        result: _T = write.result
        return result

    def _enqueue(self, write: _Write) -> bool:
        """Queue ``write``; True when the caller must now be the writer."""
        with self._mu:
            if self._closed:
                raise LedgerError(f"harness bug: the run ledger {self.path} is closed")
            self._queue.append(write)
            if self._writing:
                return False
            self._writing = True
            return True

    def _wait_for(self, write: _Write) -> bool:
        """Wait until ``write`` is done (True), or its caller is handed the writer's
        role (False). After :data:`LOCK_WAIT_S` a write still queued is withdrawn and
        :class:`LedgerError` raised; one already in a batch is left to the writer
        (whether it took effect is then unknown)."""
        if write.wake is None:
            raise RuntimeError("prohost bug: waiting for a write nobody waits for")
        write.wake.wait(LOCK_WAIT_S)
        with self._mu:
            if write.done:
                return True
            if write.lead:
                return False
            if write in self._queue:
                self._queue.remove(write)
        raise self._busy()

    def _lead(self) -> None:
        """Be the writer: apply batches until the queue is empty or a waiting caller
        takes over. The caller's own write is in the first batch."""
        if not self._lock.acquire(timeout=LOCK_WAIT_S):
            # Only a writer abandoned on a hung disk holds the connection this long:
            # fail what is queued rather than share the connection with it.
            with self._mu:
                stranded, self._queue = self._queue, []
                self._writing = False
            self._settle(stranded, error=self._busy())
            return
        try:
            while True:
                with self._mu:
                    batch, self._queue = self._queue, []
                if batch:
                    self._apply(batch)
                with self._mu:
                    if not self._queue:
                        self._writing = False
                        return
                    heir = next((w for w in self._queue if w.waits), None)
                    if heir is not None:
                        # Its caller is waiting anyway: let it carry the next batch, so
                        # this caller returns with its own write done.
                        heir.lead = True
                        if heir.wake is not None:
                            heir.wake.set()
                        return
                    # Only writes nobody waits for: apply them now, as nobody else will.
        finally:
            self._lock.release()

    def _apply(self, batch: list[_Write], *, force_durable: bool = False) -> None:
        """One transaction for ``batch`` (under ``_lock``), then wake every caller."""
        conn = self._conn
        if conn is None:
            self._settle(batch, closed=True)
            return
        if all(w.fn is _nothing for w in batch):
            self._settle(batch)  # flushes only: nothing to commit
            return
        durable = force_durable or any(w.durable for w in batch)
        try:
            if durable != self._synchronous_full:
                # Outside any transaction: sqlite ignores a change inside one.
                conn.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
                self._synchronous_full = durable
            conn.execute("BEGIN IMMEDIATE")
            for write in batch:
                if write.fn is _nothing:
                    continue
                # A savepoint per write: a failing one is rolled back alone.
                conn.execute("SAVEPOINT step")
                try:
                    write.result = write.fn(conn)
                except LedgerError as exc:
                    conn.execute("ROLLBACK TO step")
                    write.error = exc
                except Exception as exc:  # a bug or a constraint: this write alone fails
                    conn.execute("ROLLBACK TO step")
                    write.error = LedgerError(f"the run ledger {self.path} failed: {exc}")
                    write.error.__cause__ = exc
                conn.execute("RELEASE step")
            conn.execute("COMMIT")
        except Exception as exc:
            # BEGIN, a savepoint or the COMMIT failed (disk full, I/O error): nothing
            # of the batch took effect.
            _rollback(conn)
            failed = LedgerError(f"the run ledger {self.path} failed: {exc}")
            failed.__cause__ = exc
            for write in batch:
                write.result = None
                if write.error is None:
                    write.error = failed
            self._settle(batch)
            return
        with self._mu:
            self._commits += 1
            self._durable_commits += durable
        self._settle(batch)

    def _settle(self, batch: list[_Write], *, error: LedgerError | None = None,
                closed: bool = False) -> None:
        """Mark ``batch`` done and wake its callers; log the errors nobody waits for."""
        if closed:
            error = LedgerError(f"harness bug: the run ledger {self.path} is closed")
        with self._mu:
            for write in batch:
                if error is not None and write.error is None:
                    write.error = error
                write.done = True
                self._writes += write.fn is not _nothing
        for write in batch:
            if write.wake is not None:
                write.wake.set()
            elif write.error is not None:
                log.error("ledger: %s (in %s, which did not wait for its commit)",
                          write.error, write.what)

    def _flush(self) -> None:
        """Return once every write queued before the call is committed (a no-op
        write queued behind them, waited for; nothing to do when none is queued)."""
        with self._mu:
            if not self._queue and not self._writing:
                return
        self._write(_nothing, what="flush", durable=False, waits=True)

    def _busy(self) -> LedgerError:
        return LedgerError(
            f"the run ledger {self.path} is still busy with an earlier step after "
            f"{LOCK_WAIT_S:g} s (a hung or failing disk?); check the disk, then restart "
            "prohost"
        )

    @contextmanager
    def _locked(self) -> Iterator[sqlite3.Connection]:
        """The read connection, for one read (it sees the last commit)."""
        # Bounded: the holder may be a thread abandoned on a hung disk. Giving up
        # here, rather than touching the connection it is using, keeps it whole.
        if not self._read_lock.acquire(timeout=LOCK_WAIT_S):
            raise self._busy()
        try:
            if self._reader is None:
                raise LedgerError(f"harness bug: the run ledger {self.path} is closed")
            try:
                yield self._reader
            except sqlite3.Error as exc:
                raise LedgerError(f"the run ledger {self.path} failed: {exc}") from exc
        finally:
            self._read_lock.release()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """A durable transaction of its own on the write connection, outside the group
        commit: for a write that cannot be a function of the connection. Prefer
        :meth:`_write`."""
        with self._mu:
            if self._closed:
                raise LedgerError(f"harness bug: the run ledger {self.path} is closed")
        if not self._lock.acquire(timeout=LOCK_WAIT_S):
            raise self._busy()
        try:
            conn = self._conn
            if conn is None:
                raise LedgerError(f"harness bug: the run ledger {self.path} is closed")
            try:
                if not self._synchronous_full:
                    conn.execute("PRAGMA synchronous = FULL")
                    self._synchronous_full = True
                # IMMEDIATE takes the write lock up front, so a read-then-write
                # cannot interleave with another writer.
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                    conn.execute("COMMIT")
                except BaseException:
                    _rollback(conn)
                    raise
            except sqlite3.Error as exc:
                raise LedgerError(f"the run ledger {self.path} failed: {exc}") from exc
            with self._mu:
                self._commits += 1
                self._durable_commits += 1
        finally:
            self._lock.release()
        # A write queued meanwhile found a writer "at work" only if one was; none is
        # owed to this transaction, whose caller never took the writer's role.


def _connect(path: Path) -> sqlite3.Connection:
    try:
        # isolation_level=None: transactions are begun explicitly, so the sqlite3
        # module never opens one behind our back and never leaves one open.
        return sqlite3.connect(
            path,
            timeout=_BUSY_TIMEOUT_MS / 1000,
            isolation_level=None,
            check_same_thread=False,
        )
    except sqlite3.Error as exc:
        raise LedgerError(
            f"cannot open the run ledger {path}: {exc}; check that its folder exists "
            "and is writable"
        ) from exc


def _close_all(*conns: sqlite3.Connection | None) -> None:
    for conn in conns:
        if conn is not None:
            conn.close()


def _sidecar(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def _make_private(path: Path) -> None:
    """Create ``path`` 0600 before sqlite does (sqlite would use 0644 less the umask, and
    gives the -wal/-shm the same mode), or narrow an existing one."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # exactly FILE_MODE, whatever the umask
    finally:
        os.close(fd)


def _rollback(conn: sqlite3.Connection) -> None:
    # A failed COMMIT can leave the transaction open, and the next BEGIN would then
    # fail forever; a failing ROLLBACK must not hide the error that led here.
    if conn.in_transaction:
        with suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


def _prepare(conn: sqlite3.Connection, path: Path) -> None:
    """Set the connection up and bring the schema to :data:`SCHEMA_VERSION`."""
    aside = f"move it aside (for example to {path}.broken) and start prohost again"
    try:
        conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        # Reading the header first: a file that is not sqlite fails here, before any
        # pragma below could try to write to it.
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        conn.execute("PRAGMA journal_mode = WAL").fetchone()
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
        if version > SCHEMA_VERSION:
            raise LedgerError(
                f"the run ledger {path} has schema version {version}, newer than this "
                f"prohost understands ({SCHEMA_VERSION}): upgrade prohost, or {aside}"
            )
        if version == SCHEMA_VERSION:
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Read again under the write lock: another process may have migrated it.
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                tables = conn.execute(
                    "SELECT count(*) FROM sqlite_master "
                    r"WHERE name NOT LIKE 'sqlite\_%' ESCAPE '\'"
                ).fetchone()[0]
                if tables:
                    raise LedgerError(
                        f"{path} is an sqlite database but not a prohost run ledger: {aside}"
                    )
            for statements in _MIGRATIONS[version:]:
                for statement in statements:
                    conn.execute(statement)
            # PRAGMA takes no parameters; the value is our own integer.
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise
    except sqlite3.DatabaseError as exc:
        if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
            raise LedgerError(
                f"the run ledger {path} is locked by another process ({exc}); is another "
                "prohost running with the same PROHOST_HOME?"
            ) from exc
        raise LedgerError(f"{path} is not a usable prohost run ledger ({exc}): {aside}") from exc
