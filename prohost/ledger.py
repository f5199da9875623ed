"""The run ledger: every run's life on disk, so nothing is run twice and nothing is lost.

PROTOCOL.md §3 and §7. A run is written ``accepted`` (with its signed body) before its
delivery is acked, ``started`` just before its agent is spawned, ``finished`` with the
outcome to post (the ledger is the outbox), and ``reported`` once the report settled.
Each step is committed and fsync'd before the method returns, so after a crash or
``kill -9`` the next start can tell exactly what to do with every run
(:meth:`Ledger.recover`), and a redelivery of a run already in the ledger is never
executed again (:meth:`Ledger.admit`).

The same file keeps the agent session each lane last ended with, so a conversation's
next turn resumes it across restarts.

The ledger is stdlib ``sqlite3`` in WAL mode with ``synchronous=FULL``: in WAL mode
that fsyncs the log on every commit, which is the durability the protocol asks for
at the cost of one fsync per step. The file and its ``-wal``/``-shm`` are mode 0600
whatever the umask: they hold run bodies, MCP tokens and conversation text.

:class:`Ledger` is synchronous; the harness calls it through
:meth:`prohost.blocking.Bounds.run`, from one worker thread at a time or several,
since every method holds one lock. A call on a hung disk is abandoned after its
bound. That is safe because every method is a single sqlite transaction under that
lock: the abandoned thread commits or rolls back on its own whenever the disk
answers, nobody else touches the connection meanwhile (a later call waits for the
lock at most :data:`LOCK_WAIT_S`, then fails with :class:`LedgerError`), and the
step's durability is merely unknown — the next start reads the ledger (§7) and
reports whatever it finds.

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
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import TracebackType
from typing import Any

import attrs

from prohost.accounts import DEFAULT_ACCOUNT

__all__ = [
    "Admission",
    "Ledger",
    "LedgerError",
    "LedgerRow",
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


class Ledger:
    """The on-disk ledger of runs and of agent sessions per lane.

    Open it with :meth:`open`; close it with :meth:`close` (or use it as a context
    manager). Every method is one transaction that is durable when the method returns.
    Safe to call from any thread; calls are serialised by one lock.
    """

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        """Use :meth:`open`."""
        self.path = path
        self._conn: sqlite3.Connection | None = conn
        self._lock = threading.Lock()

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
        try:
            # isolation_level=None: transactions are begun explicitly below, so the
            # sqlite3 module never opens one behind our back and never leaves one open.
            conn = sqlite3.connect(
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
        try:
            _prepare(conn, path)
            # sqlite gives -wal/-shm the database's mode; files left by an older
            # prohost (or another umask) are narrowed here too.
            for sidecar in (_sidecar(path, "-wal"), _sidecar(path, "-shm")):
                with suppress(FileNotFoundError):
                    os.chmod(sidecar, FILE_MODE)
        except OSError as exc:
            conn.close()
            raise LedgerError(
                f"cannot make the run ledger {path} private: {exc.strerror or exc}"
            ) from exc
        except BaseException:
            conn.close()
            raise
        return cls(path, conn)

    def close(self) -> None:
        """Close the file. Further calls raise :class:`LedgerError`; closing twice is fine.

        When a step abandoned on a hung disk still holds the connection after
        :data:`CLOSE_WAIT_S`, the file is left to the process's exit (logged), so a
        hung disk cannot hold the exit either.
        """
        if not self._lock.acquire(timeout=CLOSE_WAIT_S):
            log.warning("the run ledger %s is still busy with a step that never finished; "
                        "leaving it open for the process exit to close", self.path)
            return
        try:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        finally:
            self._lock.release()

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

    def admit(self, run_id: str, lane: str, body: str, now: float) -> Admission:
        """Record a delivered run as accepted, unless its ``run_id`` is already here.

        Returns :attr:`Admission.NEW` after the new row is durable (the ack may be sent
        then), :attr:`Admission.HELD` when the run is in the ledger but not yet
        reported, :attr:`Admission.REPORTED` when it has been reported. Never inserts a
        ``run_id`` twice.
        """
        with self._transaction() as conn:
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

    def get(self, run_id: str) -> LedgerRow | None:
        """The run's row, or ``None`` when the ledger does not hold it (never, or pruned)."""
        with self._locked() as conn:
            found = conn.execute(
                f"SELECT {_COLUMNS} FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
        return None if found is None else _row(found)

    def mark_started(self, run_id: str, now: float) -> None:
        """Record that the agent is about to be spawned (only from ``accepted``)."""
        self._advance(run_id, RunState.STARTED, "started_at = ?", (now,))

    def record_pgid(self, run_id: str, pgid: int) -> None:
        """Record the spawned agent's process group (only while ``started``)."""
        with self._transaction() as conn:
            state = self._state_of(conn, run_id)
            if state is not RunState.STARTED:
                raise LedgerError(
                    f"harness bug: record_pgid({run_id!r}) on a run that is {state.value}, "
                    "not started"
                )
            conn.execute("UPDATE runs SET pgid = ? WHERE run_id = ?", (pgid, run_id))

    def mark_finished(self, run_id: str, outcome_json: str, now: float) -> None:
        """Save the outcome to post (``Outcome.to_json`` text); the run is now in the outbox.

        Allowed from ``started``, and from ``accepted`` for a queued run that was
        cancelled or drained before it started.
        """
        self._advance(
            run_id, RunState.FINISHED, "finished_at = ?, outcome = ?", (now, outcome_json)
        )

    def mark_reported(self, run_id: str, settlement: str, now: float) -> None:
        """Record that the run's report settled (or that it is dropped without one).

        Allowed from any earlier state. ``settlement`` says how, for people reading it.
        """
        self._advance(
            run_id, RunState.REPORTED, "reported_at = ?, settlement = ?", (now, settlement)
        )

    def recover(self) -> Recovery:
        """Classify every run not yet reported, for a start after a crash (§7)."""
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
        with self._transaction() as conn:
            deleted = conn.execute(
                "DELETE FROM runs WHERE state = ? AND reported_at < ?",
                (RunState.REPORTED.value, now - forget_after_s),
            ).rowcount
            emptied = conn.execute(
                "UPDATE runs SET lane = '', body = '', outcome = NULL, settlement = NULL "
                "WHERE state = ? AND reported_at < ? AND body != ''",
                (RunState.REPORTED.value, now - older_than_s),
            ).rowcount
            return emptied + deleted

    # -- sessions --------------------------------------------------------------------

    def session_for(self, lane: str) -> str | None:
        """The agent session the lane's last turn ended with, if any."""
        with self._locked() as conn:
            found = conn.execute(
                "SELECT session_id FROM sessions WHERE lane = ?", (lane,)
            ).fetchone()
        return None if found is None else str(found[0])

    def save_session(self, lane: str, session_id: str | None, now: float) -> None:
        """Remember the lane's session for its next turn; ``None`` forgets it."""
        with self._transaction() as conn:
            if session_id is None:
                conn.execute("DELETE FROM sessions WHERE lane = ?", (lane,))
            else:
                conn.execute(
                    "INSERT INTO sessions (lane, session_id, updated_at) VALUES (?, ?, ?) "
                    "ON CONFLICT (lane) DO UPDATE SET "
                    "session_id = excluded.session_id, updated_at = excluded.updated_at",
                    (lane, session_id, now),
                )

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

    def save_turn(self, lane: str, account: str, session_id: str | None, now: float) -> None:
        """Remember the session the lane's turn on ``account`` ended with (``None``
        forgets it) and that ``account`` is the lane's account now, in one step."""
        with self._transaction() as conn:
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

    def account_limits(self) -> dict[str, float]:
        """Every account remembered as limited, and until when (epoch s)."""
        with self._locked() as conn:
            return {str(name): float(until) for name, until in conn.execute(
                "SELECT account, limited_until FROM account_limits")}

    def save_account_limits(self, limits: dict[str, float]) -> None:
        """Replace the remembered limits with ``limits`` (account → until, epoch s)."""
        with self._transaction() as conn:
            conn.execute("DELETE FROM account_limits")
            conn.executemany(
                "INSERT INTO account_limits (account, limited_until) VALUES (?, ?)",
                sorted(limits.items()),
            )

    # -- internals -------------------------------------------------------------------

    def _advance(
        self, run_id: str, target: RunState, assignments: str, values: tuple[Any, ...]
    ) -> None:
        with self._transaction() as conn:
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

    @staticmethod
    def _state_of(conn: sqlite3.Connection, run_id: str) -> RunState:
        found = conn.execute("SELECT state FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if found is None:
            raise LedgerError(f"harness bug: run {run_id!r} is not in the ledger")
        return RunState(found[0])

    @contextmanager
    def _locked(self) -> Iterator[sqlite3.Connection]:
        # Bounded: the holder may be a thread abandoned on a hung disk. Giving up
        # here, rather than touching the connection it is using, keeps the file whole.
        if not self._lock.acquire(timeout=LOCK_WAIT_S):
            raise LedgerError(
                f"the run ledger {self.path} is still busy with an earlier step after "
                f"{LOCK_WAIT_S:g} s (a hung or failing disk?); check the disk, then restart "
                "prohost"
            )
        try:
            if self._conn is None:
                raise LedgerError(f"harness bug: the run ledger {self.path} is closed")
            try:
                yield self._conn
            except sqlite3.Error as exc:
                raise LedgerError(f"the run ledger {self.path} failed: {exc}") from exc
        finally:
            self._lock.release()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._locked() as conn:
            # IMMEDIATE takes the write lock up front, so the read-then-write in admit()
            # cannot interleave with another writer.
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise


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
