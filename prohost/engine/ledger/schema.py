"""The ledger file: its schema and migrations, and opening it privately (0600).

See :mod:`prohost.engine.ledger` for what the tables hold and why.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import sys
from contextlib import suppress
from pathlib import Path

from prohost.engine.ledger.rows import LedgerError

log = logging.getLogger("prohost.ledger")

SCHEMA_VERSION = 4
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
        # Accounts (docs/protocol.md §12). The `sessions` table above stays the implicit
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
    [
        # A session's running usage totals, for a CLI that reports those rather than
        # a turn's own figures (Codex's turn.completed): the next turn of the session
        # reports the difference (docs/protocol.md §7 ``usage``).
        """
        CREATE TABLE session_usage (
            session_id TEXT PRIMARY KEY,
            totals TEXT NOT NULL,
            updated_at REAL NOT NULL
        )
        """,
    ],
    [
        # What a run's checkouts were when it began (JSON, prohost.engine.run.startstate),
        # kept with its agent's process group: a run a kill -9 interrupted is reported
        # with what it changed since then (§7 ``changes``) by the next start. Rows of
        # an earlier version have none: reported without ``changes``, and logged.
        "ALTER TABLE runs ADD COLUMN start_state TEXT",
    ],
]
if len(_MIGRATIONS) != SCHEMA_VERSION:
    raise RuntimeError("prohost bug: the ledger's migrations do not match SCHEMA_VERSION")

#: How long a write waits for another connection's lock before failing (ms). Only one
#: harness uses a ledger (home.py holds the single-instance lock), so waiting this long
#: means something else has the file open.
_BUSY_TIMEOUT_MS = 5000

#: Mode of the ledger file and its -wal/-shm (octal): they hold run bodies, MCP tokens
#: and conversation text.
FILE_MODE = 0o600



#: The connection class the ledger's connections are made of: sqlite3's own. A seam,
#: set from outside only by the soak's and the tests' faulty disks
#: (``scripts/soaklib/faulty_ledger.py``: a COMMIT that fails as on a full disk, or
#: hangs), never by the product.
connection_class: type[sqlite3.Connection] = sqlite3.Connection


#: sqlite's primary result code for "file is not a database": the only error, with a
#: newer schema and a foreign database, that proves the file unusable.
_SQLITE_NOTADB = 26


class LedgerUnavailable(LedgerError):
    """The ledger cannot be opened now (disk full, read-only, I/O error), though
    nothing says the file is damaged: try again once the disk has recovered."""


def _connect(path: Path) -> sqlite3.Connection:
    try:
        # isolation_level=None: transactions are begun explicitly, so the sqlite3
        # module never opens one behind our back and never leaves one open.
        conn = sqlite3.connect(
            path,
            timeout=_BUSY_TIMEOUT_MS / 1000,
            isolation_level=None,
            check_same_thread=False,
            factory=connection_class,
        )
        return conn
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
        if sys.platform == "darwin":
            # On macOS fsync() leaves the data in the drive's cache: only
            # F_FULLFSYNC makes synchronous=FULL durable, and sqlite uses it (for
            # commits, and for checkpoints) only when told to.
            conn.execute("PRAGMA fullfsync = ON")
            conn.execute("PRAGMA checkpoint_fullfsync = ON")
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
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF == _SQLITE_NOTADB:
            raise LedgerError(
                f"{path} is not a usable prohost run ledger ({exc}): {aside}") from exc
        # A full, read-only or failing disk: the file is not known to be damaged, and
        # moving it aside would forget every run it holds.
        raise LedgerUnavailable(
            f"cannot open the run ledger {path} now ({exc}): is its disk full, read-only "
            "or failing? Free some space (or repair the disk) and prohost opens it; keep "
            "the file: it holds every run this harness accepted, started or finished"
        ) from exc

