"""A ledger opened alone (:meth:`Ledger.open_alone`), as a harness started on a
full disk with no reserve opens it (issue 27, point 8): one connection in sqlite's
exclusive locking mode, the WAL index in memory — no ``-shm`` file, so no new
block to open it — and still a whole ledger: reads, writes, recovery, and the file
opened the usual way afterwards. (On a real full disk: tests/commands/
test_agent_run_on_a_full_disk_without_reserve.py.)
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from prohost.engine.ledger import Admitted, Ledger, LedgerError, LedgerUnavailable


def test_a_ledger_opened_alone_needs_no_shared_index_and_works(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    with Ledger.open(path) as ledger:
        ledger.admit("r1", "lane", "{}", time.time())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.sqlite3"]
    with Ledger.open_alone(path) as alone:
        assert not path.with_name("ledger.sqlite3-shm").exists()
        row = alone.committed("r1")
        assert row is not None and row.run_id == "r1"
        assert alone.admit("r2", "lane", "{}", time.time()) is Admitted.NEW
        assert alone.admit("r1", "lane", "{}", time.time()) is Admitted.HELD
        assert [r.run_id for r in alone.recover().pending] == ["r1", "r2"]
        assert not path.with_name("ledger.sqlite3-shm").exists()
    with Ledger.open(path) as again:
        assert [r.run_id for r in again.recover().pending] == ["r1", "r2"]


def test_a_read_never_sees_a_write_not_yet_committed(tmp_path: Path) -> None:
    """One connection for both: a read made while a write's transaction is open
    (its row inserted, then rolled back) waits for it, and never sees that row."""
    path = tmp_path / "ledger.sqlite3"
    Ledger.open(path).close()
    alone = Ledger.open_alone(path)
    inserted, read_done = threading.Event(), threading.Event()
    seen: list[object] = []

    def fails_after_inserting(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO runs (run_id, lane, body, state, accepted_at) "
                     "VALUES ('r_no', 'lane', '{}', 'accepted', 0)")
        inserted.set()
        # A read that did not wait for this transaction is done well within this
        # (it is one SELECT); one that waits is not, and the write then fails.
        read_done.wait(1.0)
        raise sqlite3.OperationalError("database or disk is full")

    def read() -> None:
        seen.append(alone.committed("r_no"))
        read_done.set()

    def write() -> None:
        with pytest.raises(LedgerError):
            alone._write(fails_after_inserting, what="test")

    try:
        writer = threading.Thread(target=write)
        writer.start()
        assert inserted.wait(30)
        reader = threading.Thread(target=read)
        reader.start()
        writer.join(30)
        reader.join(30)
        assert seen == [None]
    finally:
        alone.close()


def test_a_missing_ledger_is_not_created_alone(tmp_path: Path) -> None:
    with pytest.raises(LedgerUnavailable):
        Ledger.open_alone(tmp_path / "ledger.sqlite3")
    assert list(tmp_path.iterdir()) == []
