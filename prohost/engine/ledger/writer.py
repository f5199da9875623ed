"""The ledger's group commit: one writer at a time applies every queued write in
one transaction, each in its own savepoint (the module docstring of
:mod:`prohost.engine.ledger` says why and what a hung disk does).
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

from prohost.engine.ledger.rows import LedgerError, LedgerStatistics
from prohost.engine.ledger.schema import _rollback

log = logging.getLogger("prohost.ledger")

#: How long a call waits for the ledger's own lock (s) before it gives up with a
#: LedgerError. The lock is only held that long by a step whose thread the harness
#: abandoned on a hung disk (prohost.engine.blocking); waiting forever would pile up threads.
LOCK_WAIT_S = 30.0

#: How long :meth:`Ledger.close` waits for the lock (s). By then nothing but a step
#: abandoned on a hung disk can hold it, and the process is about to exit.
CLOSE_WAIT_S = 2.0

#: A batch applying for longer than this (s) says the disk is slow or hung
#: (:meth:`GroupCommit.stalled`): admission then answers a run the ledger has already
#: reported from its last commit rather than queue a write behind that batch.
STALLED_S = 1.0

_T = TypeVar("_T")


class _Write:
    """One queued write: a function of the write connection, and what came of it.

    Every field is guarded by the ledger's queue lock, except that the writer fills
    ``result``/``error`` of the writes in its batch before it sets ``done``.
    """

    __slots__ = ("cut", "done", "durable", "error", "fn", "lead", "notify", "result",
                 "settling", "waits", "wake", "what")

    def __init__(self, fn: Callable[[sqlite3.Connection], Any], what: str, *,
                 durable: bool, waits: bool, blocks: bool = True) -> None:
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
        #: What a caller blocked in its own thread waits on (``blocks``); a write the
        #: writer thread collected for a trio caller wakes that caller through
        #: ``notify`` instead, and needs none (an Event is a lock and a condition).
        self.wake = threading.Event() if waits and blocks else None
        #: Called once it is done, outside the queue lock, by whichever thread
        #: settles it, applied or not (closed, busy, a failed round): the last write
        #: of a writer-thread job wakes its caller (``Job.settled``, served.py). Set
        #: by whoever queues the write. Not one mechanism with ``settling``: see
        #: :class:`Settling` for why both exist.
        self.notify: Callable[[], None] | None = None
        #: The writer thread commits the batch up to this write before the rest
        #: (prohost.engine.ledger.served).
        self.cut = False
        #: Told when the write settled, if it asked while applied (:class:`Settling`).
        self.settling: Settling | None = None


class Settling:
    """What a write function hands :meth:`GroupCommit._settling` while it is applied,
    to be told that its write settled (committed, failed or rolled back):
    :meth:`settled` is called once, under the ledger's queue lock (it must not take
    it), by the thread that settles it.

    Why a second callback beside ``_Write.notify``: the two must run on opposite
    sides of the queue lock, and are registered by different parties.

    - :meth:`settled` runs under the lock, in the same critical section that marks
      the write done, before any caller of its batch is woken: an admit's ticket
      is forgotten and its ``done`` set atomically with its write's ``done``, so
      ``Ledger.withdraw_admits`` (which decides a 503 under that lock) never finds
      a ticket still under way whose write is settled; and ``Ledger.admit``'s own
      failure path decides and settles its ticket in one hold of that lock.
    - ``notify`` runs outside it: ``Job.settled``, in any thread but the writer
      thread (a worker thread still leading the group commit when the writer
      thread began, a writer that gave up on the connection's lock), wakes its job
      at once, which first reads the ledger (``Job.then``): I/O, and in
      ``Ledger.open_alone`` the write connection's lock. Under the queue lock that
      would hold the trio thread, which takes it (``submit``, ``withdraw_admits``,
      ``_queue_behind_writer``) and must never wait on a disk.

    And ``notify`` is set by whoever queues the write, and called whether or not
    the write was ever applied (closed, the connection busy, a failed round: the
    job's caller must hear); a :class:`Settling` only by the write function while
    it is applied, since ``Ledger.admit`` never holds its ``_Write`` (its write may
    be collected for the writer thread, or wrapped) — and an admit never applied
    needs none (``withdraw_admits`` withdraws its ticket).
    """

    def settled(self) -> None:
        """Its write is settled (under the queue lock)."""


#: Per thread: the writes being collected instead of queued (``writes``; unset or
#: ``None`` when none are), by the ledger's writer thread (prohost.engine.ledger.served).
_capturing = threading.local()


def _nothing(conn: sqlite3.Connection) -> None:
    """The write of a flush: it only waits for every write queued before it."""


class GroupCommit:
    """The write and read connections of a ledger file, and the group commit that
    applies every write (see :mod:`prohost.engine.ledger`). :class:`~prohost.engine.ledger.Ledger`
    is one; safe to call from any thread.
    """

    def __init__(self, path: Path, conn: sqlite3.Connection,
                 reader: sqlite3.Connection) -> None:
        """Use :meth:`open`."""
        self.path = path
        #: One connection for both (``Ledger.open_alone``, a full disk): reads then
        #: take the write lock too — re-entrant, for a read the writer makes itself
        #: once its commit is done — so they never see a write not yet committed.
        alone = reader is conn
        #: The write connection; only the holder of ``_lock`` uses it.
        self._conn: sqlite3.Connection | None = conn
        self._lock: threading.Lock = (
            cast(threading.Lock, threading.RLock()) if alone else threading.Lock())
        #: The read connection (WAL: reads the last commit, never waits for a write);
        #: only the holder of ``_read_lock`` uses it.
        self._reader: sqlite3.Connection | None = reader
        self._read_lock = self._lock if alone else threading.Lock()
        #: Guards the queue and the fields below; never held across I/O.
        self._mu = threading.Lock()
        self._queue: list[_Write] = []
        #: A caller is the writer (applying batches, or about to).
        self._writing = False
        self._closed = False
        self._synchronous_full = True  # what _prepare set on the write connection
        self._writes = 0
        #: The ledger's writer thread is serving (prohost.engine.ledger.served): it
        #: applies every write, and no caller leads. Its requests, wake-ups (one per
        #: write queued) and its stop go through ``_wakes``.
        self._serving = False
        self._wakes: queue.SimpleQueue[object] = queue.SimpleQueue()
        #: The ``accepted`` writes not settled yet, by run (``Ledger.admit``): a 503
        #: waits for those whose transaction is under way (``Ledger.withdraw_admits``).
        self._admits: dict[str, list[Any]] = {}
        #: The write being applied (only the holder of ``_lock`` uses it).
        self._applied: _Write | None = None
        #: When the batch being applied began (``time.monotonic()``), if one is.
        self._applying_since: float | None = None

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
            self._wakes.put(None)  # a writer thread still serving sees it and ends
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

    def stalled(self) -> bool:
        """A batch has been applying for :data:`STALLED_S` or longer (a slow or hung
        disk): a write queued now waits for it. Never blocks."""
        since = self._applying_since
        return since is not None and time.monotonic() - since >= STALLED_S

    def statistics(self) -> LedgerStatistics:
        """The ledger's counters now (see :class:`LedgerStatistics`)."""
        with self._mu:
            return LedgerStatistics(
                queued=len(self._queue),
                writes=self._writes,
            )

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
        captured: list[_Write] | None = getattr(_capturing, "writes", None)
        write = _Write(fn, what, durable=durable, waits=waits, blocks=captured is None)
        if captured is not None:
            captured.append(write)  # the writer thread queues it (served.py)
            return None  # type: ignore[return-value]  # the result comes with the write
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

    def _queue_behind_writer(self, fn: Callable[[sqlite3.Connection], Any], *,
                             what: str) -> bool:
        """Queue ``fn`` as a non-durable write for the writer at work, without waiting
        and without a worker thread: True once it is queued (that writer, or the caller
        it hands its role to, applies it before the role ends — see :meth:`_lead`),
        False when no writer is at work (nothing is queued; write it with
        :meth:`_write` then). Its errors are logged, like any write nobody waits for.

        Never blocks on I/O (only the queue's own lock), so the trio thread may call it.
        """
        with self._mu:
            if self._closed:
                raise LedgerError(f"harness bug: the run ledger {self.path} is closed")
            if not (self._writing or self._serving):
                return False
            self._queue.append(_Write(fn, what, durable=False, waits=False))
        if self._serving:
            self._wakes.put(None)
        return True

    def _enqueue(self, write: _Write) -> bool:
        """Queue ``write``; True when the caller must now be the writer."""
        with self._mu:
            if self._closed:
                raise LedgerError(f"harness bug: the run ledger {self.path} is closed")
            self._queue.append(write)
            lead = not (self._serving or self._writing)
            if lead:
                self._writing = True
            serving = self._serving
        if serving:
            self._wakes.put(None)  # the writer thread applies it
        return lead

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
                    if not self._queue or self._serving:
                        # Serving: the writer thread takes the rest (it waits for
                        # this role to end before it takes a batch).
                        self._writing = False
                        if self._serving:
                            self._wakes.put(None)
                        return
                    heir = next((w for w in self._queue if w.wake is not None), None)
                    if heir is not None and heir.wake is not None:
                        # Its caller is waiting anyway: let it carry the next batch, so
                        # this caller returns with its own write done.
                        heir.lead = True
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
        self._applying_since = time.monotonic()
        try:
            self._apply_batch(conn, batch, force_durable=force_durable)
        finally:
            self._applying_since = None

    def _apply_batch(self, conn: sqlite3.Connection, batch: list[_Write], *,
                     force_durable: bool) -> None:
        durable = force_durable or any(w.durable for w in batch)
        try:
            if durable != self._synchronous_full:
                # Outside any transaction: sqlite ignores a change inside one.
                conn.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
                self._synchronous_full = durable
            # A savepoint per write, so that a failing one is rolled back alone; a
            # batch of one write (every step of a harness at rest) needs none: the
            # transaction is its savepoint (two statements fewer per step).
            alone = sum(write.fn is not _nothing for write in batch) == 1
            conn.execute("BEGIN IMMEDIATE")
            for write in batch:
                if write.fn is _nothing:
                    continue
                if not alone:
                    conn.execute("SAVEPOINT step")
                self._applied = write
                try:
                    write.result = write.fn(conn)
                except LedgerError as exc:
                    write.error = exc
                except Exception as exc:  # a bug or a constraint: this write alone fails
                    write.error = LedgerError(f"the run ledger {self.path} failed: {exc}")
                    write.error.__cause__ = exc
                finally:
                    self._applied = None  # _settling is for the write being applied only
                if alone:
                    continue
                if write.error is not None:
                    conn.execute("ROLLBACK TO step")
                conn.execute("RELEASE step")
            if alone and any(write.error is not None for write in batch):
                _rollback(conn)  # the one write failed: none of it stays
            else:
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
                if write.settling is not None:
                    write.settling.settled()
        for write in batch:
            if write.wake is not None:
                write.wake.set()
            elif write.error is not None and not write.waits:
                log.error("ledger: %s (in %s, which did not wait for its commit)",
                          write.error, write.what)
            if write.notify is not None:
                write.notify()

    def _settling(self, settling: Settling) -> None:
        """From a write function being applied: have ``settling`` told when its write
        settles (whatever wraps the function)."""
        write = self._applied
        if write is None:
            raise RuntimeError("prohost bug: _settling called outside a write")
        write.settling = settling

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
