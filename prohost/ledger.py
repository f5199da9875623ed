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
at the cost of one fsync per step. :class:`Ledger` is synchronous; the harness calls
it through ``trio.to_thread.run_sync``, one worker thread at a time or several, since
every method holds one lock.
"""

from __future__ import annotations

import enum
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import TracebackType
from typing import Any

import attrs

__all__ = [
    "Admission",
    "Ledger",
    "LedgerError",
    "LedgerRow",
    "Recovery",
    "RunState",
    "process_belongs_to_run",
]

SCHEMA_VERSION = 1
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
]
assert len(_MIGRATIONS) == SCHEMA_VERSION

# How long a write waits for another connection's lock before failing. Only one
# harness uses a ledger (home.py holds the single-instance lock), so waiting this long
# means something else has the file open.
_BUSY_TIMEOUT_MS = 5000


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
    """The agent's process group, once spawned (see :func:`process_belongs_to_run`)."""
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
        except BaseException:
            conn.close()
            raise
        return cls(path, conn)

    def close(self) -> None:
        """Close the file. Further calls raise :class:`LedgerError`; closing twice is fine."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

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

    def prune(self, now: float, older_than_s: float = 7 * 86400) -> int:
        """Delete reported runs reported more than ``older_than_s`` before ``now``.

        Returns how many were deleted. Runs not yet reported are never pruned.
        """
        with self._transaction() as conn:
            cursor = conn.execute(
                "DELETE FROM runs WHERE state = ? AND reported_at < ?",
                (RunState.REPORTED.value, now - older_than_s),
            )
            return cursor.rowcount

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
        with self._lock:
            if self._conn is None:
                raise LedgerError(f"harness bug: the run ledger {self.path} is closed")
            try:
                yield self._conn
            except sqlite3.Error as exc:
                raise LedgerError(f"the run ledger {self.path} failed: {exc}") from exc

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


# -- the agent process at restart -----------------------------------------------------


def process_belongs_to_run(pgid: int, run_id: str) -> bool:
    """Whether process group ``pgid`` is alive and really is run ``run_id``'s agent.

    At restart the ledger only has the group id recorded when the run started; the
    group may be long gone and its number reused by anything. So the group must be
    alive and a process in it (the leader first) must have been started with
    ``PROHOST_RUN_ID=<run_id>`` in its environment, which every agent and its children
    inherit. The leader may have exited while its children live on, so the other
    members of the group are checked too. False whenever that cannot be established
    (another user's process, no ``/proc`` and no ``ps``, an unsupported platform).

    Blocking (reads ``/proc``, or runs ``ps`` on macOS): call it from a thread.
    """
    # Zero and negative numbers mean "my own group" or "every process" to killpg, and
    # 1 is init's: none of them can be an agent's group.
    if pgid <= 1:
        return False
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        # PermissionError: the group exists but belongs to another user, so it is not
        # an agent this harness started.
        return False
    except OSError:
        return False
    needle = f"PROHOST_RUN_ID={run_id}"
    if sys.platform.startswith("linux") and os.path.isdir("/proc/self"):
        return any(needle in _proc_environ(pid) for pid in _proc_group_members(pgid))
    if sys.platform == "darwin":
        return any(needle in _ps_environ(pid) for pid in _ps_group_members(pgid))
    return False


def _proc_environ(pid: int) -> set[str]:
    """The environment ``pid`` was started with (Linux), empty when unreadable."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return set()
    return {item.decode("utf-8", "replace") for item in raw.split(b"\0") if item}


def _proc_group_members(pgid: int) -> list[int]:
    """The pids in process group ``pgid``, the leader first (Linux)."""
    members = [pgid]
    try:
        entries = os.listdir("/proc")
    except OSError:
        return members
    for entry in entries:
        if not entry.isdigit() or int(entry) == pgid:
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text("utf-8", "replace")
        except OSError:
            continue
        # The command name (field 2) is in parentheses and may hold spaces or ')',
        # so the fields are counted from the last ')': state, ppid, pgrp.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[2] == str(pgid):
            members.append(int(entry))
    return members


def _ps(arguments: list[str]) -> str:
    try:
        result = subprocess.run(
            ["ps", *arguments], capture_output=True, text=True, errors="replace", timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return result.stdout if result.returncode == 0 else ""


def _ps_environ(pid: int) -> set[str]:
    """Words of ``pid``'s command line and environment, from ``ps eww`` (macOS).

    ``ps`` prints the environment space-separated after the command, so an entry is
    found as a whole word; a run id has no spaces (§3), so the match is exact.
    """
    return set(_ps(["eww", "-o", "command=", "-p", str(pid)]).split())


def _ps_group_members(pgid: int) -> list[int]:
    """The pids in process group ``pgid``, the leader first, from ``ps`` (macOS)."""
    members = [pgid]
    for line in _ps(["-A", "-o", "pid=,pgid="]).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] == str(pgid) and parts[0] != str(pgid):
            members.append(int(parts[0]))
    return members
