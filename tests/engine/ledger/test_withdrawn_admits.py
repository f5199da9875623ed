"""A 503 for a run means "not recorded", for good (issue 27, point 3): before it,
every ``accepted`` write of the run not applied yet is withdrawn (it inserts
nothing when the disk answers), and a write whose own transaction is under way
holds the answer back until the disk has said whether its row landed — then the
last commit is final for the run, whatever is killed when.

The wire, and the next start after a kill at the gap, are in
tests/harness/test_hung_ledger_writes.py.

Real parts: a sqlite file, the ledger's writer thread, a write held on a
``threading.Event`` inside the writer's transaction; trio's mock clock leaps to the
bound once the write hangs.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import trio
import trio.testing

from prohost.engine.blocking import Bounds, StepTimedOut
from prohost.engine.ledger import Admitted, Ledger
from prohost.engine.ledger.steps import LedgerSteps
from tests.kits.ledger import CommitHangs

WAIT_S = 30.0


async def gave_up(steps: LedgerSteps, run_id: str, mock_clock: trio.testing.MockClock,
                  hung: threading.Event) -> None:
    """``steps.admit(run_id)`` until its bound passes (it must), once ``hung`` says
    the ledger's writer hangs."""
    async with trio.open_nursery() as nursery:
        abandoned = trio.Event()

        async def admit() -> None:
            with pytest.raises(StepTimedOut):
                await steps.admit(run_id, "lane", "{}")
            abandoned.set()

        nursery.start_soon(admit)
        await trio.to_thread.run_sync(hung.wait, WAIT_S)
        mock_clock.autojump_threshold = 0
        await abandoned.wait()
        mock_clock.autojump_threshold = float("inf")


async def abandoned_at_its_bound(steps: LedgerSteps, run_id: str) -> None:
    """``steps.admit(run_id)``, given up at its bound (its write lands or not)."""
    with pytest.raises(StepTimedOut):
        await steps.admit(run_id, "lane", "{}")


@pytest.mark.protocol("§3", "§7")
@pytest.mark.parametrize("served", [True, False], ids=["writer thread", "worker threads"])
async def test_an_admit_whose_commit_is_under_way_holds_the_answer_until_it_lands(
    tmp_path: Path, mock_clock: trio.testing.MockClock, served: bool,
) -> None:
    path = tmp_path / "ledger.sqlite3"
    ledger = CommitHangs.open(path)
    try:
        steps = LedgerSteps(ledger, Bounds())
        async with trio.open_nursery() as writer:
            if served:
                await writer.start(steps.writer)
            await gave_up(steps, "r1", mock_clock, ledger.holding)
            # Its row may still land: no 503 may be sent now, and it is not withdrawn.
            under_way = steps.under_way("r1")
            assert len(under_way) == 1 and not under_way[0].withdrawn
            assert not under_way[0].done.is_set()
            ledger.release.set()  # the disk answers
            await steps.settled(under_way)
            # Settled: the last commit is final for the run, and holds its row (200).
            assert steps.under_way("r1") == []
            row = await steps.known("r1")
            assert row is not None and row.run_id == "r1" and row.state == "accepted"
            writer.cancel_scope.cancel()
    finally:
        ledger.release.set()
        ledger.close()
    with Ledger.open(path) as reopened:
        assert [row.run_id for row in reopened.recover().pending] == ["r1"]


@pytest.mark.protocol("§3", "§7")
@pytest.mark.parametrize("served", [True, False], ids=["writer thread", "worker threads"])
async def test_an_admit_queued_behind_a_hung_write_is_withdrawn_and_inserts_nothing(
    tmp_path: Path, mock_clock: trio.testing.MockClock, served: bool,
) -> None:
    """The 503's common case: another run's write hangs and this one waits behind
    it. Withdrawn at once, it inserts nothing when the disk answers — no later
    commit is needed, so no kill can leave its row behind."""
    path = tmp_path / "ledger.sqlite3"
    ledger = CommitHangs.open(path)
    try:
        steps = LedgerSteps(ledger, Bounds())
        async with trio.open_nursery() as writer:
            if served:
                await writer.start(steps.writer)
            writer.start_soon(abandoned_at_its_bound, steps, "r0")
            await trio.to_thread.run_sync(ledger.holding.wait, WAIT_S)
            behind = threading.Event()  # (the writer already hangs)
            behind.set()
            await gave_up(steps, "r1", mock_clock, behind)
            assert steps.under_way("r1") == []  # withdrawn: a 503 is safe now
            ledger.release.set()
            found = await trio.to_thread.run_sync(ledger.recover)  # waits for both
            assert [row.run_id for row in found.pending] == ["r0"]
            # A redelivery is recorded afresh (and acked 200 then).
            assert await steps.admit("r1", "lane", "{}") is Admitted.NEW
            writer.cancel_scope.cancel()
    finally:
        ledger.release.set()
        ledger.close()
    with Ledger.open(path) as reopened:
        assert [row.run_id for row in reopened.recover().pending] == ["r0", "r1"]
