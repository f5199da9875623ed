"""An ``accepted`` write abandoned at its bound is withdrawn (issue 27, point 3):
its delivery is answered 503, so the run must never be run here.

The common case — the write still queued behind a hung one, so it inserts nothing
when the disk answers — is seen on the wire in tests/harness/test_hung_ledger_writes.py.
Here the other: the write's own transaction is under way (its row inserted, its
commit hanging) when the bound passes; the row lands, and the next commit deletes it.

Real parts: a sqlite file, the ledger's writer thread, a write held on a
``threading.Event`` inside the writer's transaction; trio's mock clock leaps to the
bound once the write hangs.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
import trio.testing

from prohost.engine.blocking import Bounds, StepTimedOut
from prohost.engine.ledger import Admitted, Ledger
from prohost.engine.ledger.steps import LedgerSteps

_T = TypeVar("_T")
WAIT_S = 30.0


class CommitHangs(Ledger):
    """A real ledger whose first ``admit`` write hangs after its INSERT, inside its
    transaction (as a hung COMMIT would)."""

    holding: threading.Event
    release: threading.Event

    def _write(self, fn: Callable[[sqlite3.Connection], _T], *, what: str,
               durable: bool = True, waits: bool | None = None) -> _T:
        if what == "admit" and not self.holding.is_set():
            real = fn

            def hangs_after(conn: sqlite3.Connection) -> Any:
                result = real(conn)
                self.holding.set()
                self.release.wait(WAIT_S)
                return result

            fn = hangs_after
        return super()._write(fn, what=what, durable=durable, waits=waits)


@pytest.mark.protocol("§3", "§7")
async def test_a_row_whose_commit_was_under_way_at_the_bound_is_taken_back(
    tmp_path: Path, mock_clock: trio.testing.MockClock,
) -> None:
    path = tmp_path / "ledger.sqlite3"
    ledger = CommitHangs.open(path)
    ledger.holding, ledger.release = threading.Event(), threading.Event()
    try:
        steps = LedgerSteps(ledger, Bounds())
        async with trio.open_nursery() as writer:
            await writer.start(steps.writer)
            gave_up: list[BaseException] = []

            async def admit() -> None:
                try:
                    await steps.admit("r1", "lane", "{}")
                except StepTimedOut as exc:
                    gave_up.append(exc)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(admit)
                await trio.to_thread.run_sync(ledger.holding.wait, WAIT_S)
                mock_clock.autojump_threshold = 0
            mock_clock.autojump_threshold = float("inf")
            assert gave_up  # the delivery is answered 503
            # The disk answers: the row commits, then the delete queued behind it.
            ledger.release.set()
            found = await trio.to_thread.run_sync(ledger.recover)  # waits for both
            assert found.pending == []
            assert ledger.get("r1") is None
            # A redelivery is recorded afresh (and acked 200 then).
            assert await steps.admit("r1", "lane", "{}") is Admitted.NEW
            writer.cancel_scope.cancel()
    finally:
        ledger.release.set()
        ledger.close()
    with Ledger.open(path) as reopened:
        pending = reopened.recover().pending
        assert [row.run_id for row in pending] == ["r1"] and len(pending) == 1


@pytest.mark.protocol("§3", "§7")
async def test_without_the_writer_thread_the_row_is_taken_back_too(
    tmp_path: Path, mock_clock: trio.testing.MockClock,
) -> None:
    """A bare LedgerSteps (no writer thread: the admit's worker thread leads the group
    commit and hangs in it): the delete is queued behind it, hidden from reads
    until applied, and applied once the disk answers."""
    ledger = CommitHangs.open(tmp_path / "ledger.sqlite3")
    ledger.holding, ledger.release = threading.Event(), threading.Event()
    try:
        steps = LedgerSteps(ledger, Bounds())
        async with trio.open_nursery() as nursery:
            gave_up: list[BaseException] = []

            async def admit() -> None:
                try:
                    await steps.admit("r1", "lane", "{}")
                except StepTimedOut as exc:
                    gave_up.append(exc)

            nursery.start_soon(admit)
            await trio.to_thread.run_sync(ledger.holding.wait, WAIT_S)
            mock_clock.autojump_threshold = 0
        mock_clock.autojump_threshold = float("inf")
        assert gave_up
        assert ledger.statistics().queued == 1  # the delete, behind the hung write
        ledger.release.set()
        found = await trio.to_thread.run_sync(ledger.recover)
        assert found.pending == [] and ledger.get("r1") is None
        assert await steps.known("r1") is None
    finally:
        ledger.release.set()
        ledger.close()
