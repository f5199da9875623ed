"""Test pieces for the run ledger: what sqlite itself did on the ledger's write
connection (:class:`Commits`), and a ledger whose writes fail, hang or kill the
process at a chosen step (:class:`FaultyLedger`), for the fault-point matrix
(tests/engine/ledger/test_fault_matrix.py) and the crash child (tests/kits/ledger_crash_child.py).

Faults are injected under the group commit, into the real write of the chosen step,
so everything above it — the runner's real steps, its bounds, its reports — is the
production code.
"""

from __future__ import annotations

import errno
import os
import signal
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from prohost.engine.ledger import Ledger, _Write

_T = TypeVar("_T")

#: The ledger write of each durable step of a run's life, by the name the group
#: commit knows it by (``_Write.what``).
STEP_WRITES = {
    "accepted": "admit",
    "started": "mark_started",
    "process group": "record_pgid",
    "session": "save_turn",
    "finished": "mark_finished",
    "reported": "mark_reported",
    "account limit": "save_account_limits",
    "tombstone": "prune",
}


class Commits:
    """The commits sqlite ran on ``ledger``'s write connection from now on, seen
    through its trace callback: how many, and how many with ``synchronous=FULL``
    (each one an fsync of the WAL)."""

    def __init__(self, ledger: Ledger) -> None:
        self.total = 0
        self.durable = 0
        # Under the write connection's lock: no writer is using it meanwhile.
        with ledger._lock:
            conn = ledger._conn
            assert conn is not None and not conn.in_transaction
            self._full = int(conn.execute("PRAGMA synchronous").fetchone()[0]) == 2
            # Called in whichever thread is the ledger's writer, one statement at a time.
            conn.set_trace_callback(self._saw)

    def _saw(self, statement: str) -> None:
        text = " ".join(statement.split()).upper()
        if text.startswith("PRAGMA SYNCHRONOUS ="):
            self._full = text.endswith("FULL")
        elif text == "COMMIT":
            self.total += 1
            self.durable += self._full

    def counts(self) -> tuple[int, int]:
        """(commits, of those fsync'd) so far."""
        return self.total, self.durable


class Fault:
    """What to do to the first write named ``what``: ``kind`` is

    - ``disk_full``: sqlite fails it as a full disk would (``SQLITE_FULL`` inside
      its transaction: the group commit rolls it back and raises LedgerError);
    - ``oserror``: the call raises ``OSError(ENOSPC)`` before anything is queued;
    - ``hang``: the write blocks inside the writer's transaction until
      :attr:`release` is set (a hung disk), then goes through;
    - ``kill_before`` / ``kill_after``: SIGKILL this process just before the
      transaction holding the write begins, or just after it committed.

    With ``until_released``, a ``disk_full`` fault fails every write named
    ``what`` (counted in :attr:`hits`, :attr:`failed_twice` set at the second)
    until :attr:`release` is set: a disk that stays full.
    """

    def __init__(self, what: str, kind: str, *, until_released: bool = False) -> None:
        self.what = what
        self.kind = kind
        self.until_released = until_released
        self.hits = 0
        self.failed_twice = threading.Event()
        #: Set once the step's write was called.
        self.hit = threading.Event()
        #: ``hang``: set once the write hangs inside the writer's transaction.
        self.hanging = threading.Event()
        self.release = threading.Event()


class FaultyLedger(Ledger):
    """A real ledger, with one :class:`Fault` injected into its writes."""

    fault: Fault | None = None

    def _write(self, fn: Callable[[sqlite3.Connection], _T], *, what: str,
               durable: bool = True, waits: bool | None = None) -> _T:
        fault = self._take(what)
        if fault is not None:
            if fault.kind == "oserror":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            fn = _faulty(fn, fault)
        return super()._write(fn, what=what, durable=durable, waits=waits)

    def _queue_behind_writer(self, fn: Callable[[sqlite3.Connection], Any], *,
                             what: str) -> bool:
        fault = self._take(what)
        if fault is not None:
            if fault.kind == "oserror":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            fn = _faulty(fn, fault)
        queued = super()._queue_behind_writer(fn, what=what)
        if not queued and fault is not None:
            self.fault = fault  # not queued: the caller writes it again, take it then
            fault.hit.clear()
        return queued

    def _apply(self, batch: list[_Write], *, force_durable: bool = False) -> None:
        kill = [getattr(w.fn, "fault", None) for w in batch]
        kinds = {f.kind for f in kill if isinstance(f, Fault)}
        if "kill_before" in kinds:
            os.kill(os.getpid(), signal.SIGKILL)
        super()._apply(batch, force_durable=force_durable)
        if "kill_after" in kinds:
            os.kill(os.getpid(), signal.SIGKILL)

    def _take(self, what: str) -> Fault | None:
        fault = self.fault
        if fault is None or fault.what != what:
            return None
        if fault.until_released:
            if fault.release.is_set():
                self.fault = None
                return None
        else:
            self.fault = None
        fault.hit.set()
        return fault


def _faulty(fn: Callable[[sqlite3.Connection], _T], fault: Fault
            ) -> Callable[[sqlite3.Connection], _T]:
    def write(conn: sqlite3.Connection) -> _T:
        if fault.kind == "disk_full":
            fault.hits += 1
            if fault.hits == 2:
                fault.failed_twice.set()
            raise sqlite3.OperationalError("database or disk is full")
        if fault.kind == "hang":
            fault.hanging.set()
            fault.release.wait(60)
        return fn(conn)

    write.fault = fault  # type: ignore[attr-defined]
    return write


#: Bound on a hung write's real wait for its release (s): a test that forgets to
#: release it ends, late, instead of hanging.
HUNG_WAIT_S = 30.0


class CommitHangs(Ledger):
    """A real ledger whose first ``admit`` write hangs after its INSERT, inside its
    transaction (as a hung COMMIT would): :attr:`holding` is set once it hangs, and
    it goes on when :attr:`release` is set. Past its bound the row may still land.

    Each ledger opened has events of its own, unless a subclass names them on the
    class: a harness opens its ledger itself, so its test reaches them there."""

    holding: threading.Event
    release: threading.Event

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.holding = getattr(type(self), "holding", None) or threading.Event()
        self.release = getattr(type(self), "release", None) or threading.Event()

    def _write(self, fn: Callable[[sqlite3.Connection], _T], *, what: str,
               durable: bool = True, waits: bool | None = None) -> _T:
        if what == "admit" and not self.holding.is_set():
            fn = hung_until(fn, self.holding, self.release)
        return super()._write(fn, what=what, durable=durable, waits=waits)


def hung_until(fn: Callable[[sqlite3.Connection], _T], hanging: threading.Event,
               release: threading.Event) -> Callable[[sqlite3.Connection], _T]:
    """``fn``, then ``hanging`` set and a wait for ``release`` while still inside the
    writer's transaction: the write's changes are made but not committed yet."""
    def write(conn: sqlite3.Connection) -> _T:
        result = fn(conn)
        hanging.set()
        release.wait(HUNG_WAIT_S)
        return result

    return write
