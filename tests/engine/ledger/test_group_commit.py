"""The ledger's group commit (issue 11) against a real sqlite file and real threads.

The writer is held inside its transaction by a write that waits on a
``threading.Event`` (:class:`GatedLedger`), the way a slow fsync would hold it, so
that what queues behind it — and what does not — is seen exactly. The test knows
how many writes are queued from the ledger itself (``_enqueue``), never by waiting
a while.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from prohost.engine.accounts.book import DEFAULT_ACCOUNT
from prohost.engine.blocking import StepTimedOut, run_bounded
from prohost.engine.ledger import Admitted, Ledger, LedgerError, RunState, UnreportedRuns, _Write
from prohost.wire.runs import Outcome
from tests.kits.ledger import Commits

#: Bound on every wait for a thread in these tests (s); nothing here takes long.
WAIT_S = 30.0


class GatedLedger(Ledger):
    """A real ledger with a write that holds the writer until ``release`` is set."""

    release: threading.Event
    #: Set once the holding write is inside the writer's transaction.
    holding: threading.Event
    #: Notified on every write queued; ``queued`` counts them.
    counted: threading.Condition
    queued: int
    #: The commits sqlite ran (its trace callback), and how many were fsync'd.
    commits: Commits

    def hold(self) -> None:
        """One write that keeps the writer (and its transaction) busy until released."""

        def wait(conn: sqlite3.Connection) -> None:
            self.holding.set()
            self.release.wait(WAIT_S)

        self._write(wait, what="hold")

    def _enqueue(self, write: _Write) -> bool:
        must_lead = super()._enqueue(write)
        with self.counted:
            self.queued += 1
            self.counted.notify_all()
        return must_lead

    def wait_queued(self, count: int) -> None:
        """Return once ``count`` writes were queued since the ledger was opened."""
        with self.counted:
            if not self.counted.wait_for(lambda: self.queued >= count, WAIT_S):
                raise TimeoutError(f"only {self.queued} of {count} writes were queued")


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.sqlite3"


@pytest.fixture
def ledger(path: Path) -> Iterator[GatedLedger]:
    opened = GatedLedger.open(path)
    opened.release = threading.Event()
    opened.holding = threading.Event()
    opened.counted = threading.Condition()
    opened.queued = 0
    opened.commits = Commits(opened)
    yield opened
    opened.release.set()  # never leave a writer held
    opened.close()


def sub(after: tuple[int, int], before: tuple[int, int]) -> tuple[int, int]:
    return after[0] - before[0], after[1] - before[1]


def committed_states(path: Path) -> dict[str, str]:
    """The rows another connection sees: only what was committed."""
    with sqlite3.connect(path) as other:
        return dict(other.execute("SELECT run_id, state FROM runs").fetchall())


async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn`` in a worker thread, abandoned (and the test failed) if it blocks."""
    with trio.fail_after(WAIT_S):
        return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)


@pytest.mark.protocol("§7")
async def test_sixteen_writes_waiting_together_share_one_commit(
    ledger: GatedLedger, path: Path
) -> None:
    returned: list[str] = []

    def admit(run_id: str) -> None:
        assert ledger.admit(run_id, f"conv:{run_id}", "{}", now=1.0) is Admitted.NEW
        # Durable on return: another connection sees it.
        assert committed_states(path)[run_id] == "accepted"
        returned.append(run_id)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(in_thread, ledger.hold)
        await in_thread(ledger.holding.wait)
        before = ledger.statistics()
        commits_before = ledger.commits.counts()
        for index in range(16):
            nursery.start_soon(in_thread, admit, f"run-{index}")
        await in_thread(ledger.wait_queued, 17)
        # All 16 wait behind the commit under way; none returned before its own.
        assert ledger.statistics().queued == 16
        assert returned == []
        assert committed_states(path) == {}
        ledger.release.set()

    after = ledger.statistics()
    assert sorted(returned) == sorted(f"run-{index}" for index in range(16))
    # The held write's commit, then one commit (one fsync) for all sixteen.
    assert sub(ledger.commits.counts(), commits_before) == (2, 2)
    assert after.writes - before.writes == 17


@pytest.mark.protocol("§7")
async def test_one_write_at_a_time_costs_one_commit_each(ledger: GatedLedger) -> None:
    for index in range(5):
        assert await in_thread(ledger.admit, f"run-{index}", "lane", "{}", 1.0) is Admitted.NEW
    assert ledger.commits.counts() == (5, 5)


@pytest.mark.protocol("§7")
async def test_a_failing_write_fails_only_its_own_caller(
    ledger: GatedLedger, path: Path
) -> None:
    results: dict[str, object] = {}

    def call(name: str, fn: Callable[..., object], *args: object) -> None:
        try:
            results[name] = fn(*args)
        except LedgerError as exc:
            results[name] = exc

    async with trio.open_nursery() as nursery:
        nursery.start_soon(in_thread, ledger.hold)
        await in_thread(ledger.holding.wait)
        before = ledger.commits.counts()
        nursery.start_soon(in_thread, call, "first", ledger.admit, "run-1", "lane", "{}", 1.0)
        await in_thread(ledger.wait_queued, 2)
        # A harness bug (an unknown run) and a constraint (a body that is not text).
        nursery.start_soon(in_thread, call, "bug", ledger.mark_started, "run-nope", 2.0)
        await in_thread(ledger.wait_queued, 3)
        nursery.start_soon(in_thread, call, "constraint", ledger.admit, "run-bad", "lane",
                           None, 3.0)
        await in_thread(ledger.wait_queued, 4)
        nursery.start_soon(in_thread, call, "last", ledger.admit, "run-2", "lane", "{}", 4.0)
        await in_thread(ledger.wait_queued, 5)
        ledger.release.set()

    # The four were one batch, and only the two bad ones failed.
    assert ledger.commits.total - before[0] == 2
    assert results["first"] is Admitted.NEW
    assert results["last"] is Admitted.NEW
    assert isinstance(results["bug"], LedgerError)
    assert "harness bug: run 'run-nope' is not in the ledger" in str(results["bug"])
    assert isinstance(results["constraint"], LedgerError)
    assert "NOT NULL" in str(results["constraint"])
    assert committed_states(path) == {"run-1": "accepted", "run-2": "accepted"}


async def test_reads_do_not_queue_behind_a_write_under_way(ledger: GatedLedger) -> None:
    ledger.save_turn("conv:A", DEFAULT_ACCOUNT, "sess-1", now=1.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(in_thread, ledger.hold)
        await in_thread(ledger.holding.wait)
        # The writer is inside its transaction: a read still answers, from the last
        # commit. (With one connection and one lock this would wait for the writer.)
        assert await in_thread(ledger.account_session, "conv:A", DEFAULT_ACCOUNT) == "sess-1"
        assert await in_thread(ledger.account_session, "conv:B", DEFAULT_ACCOUNT) is None
        ledger.release.set()


@pytest.mark.protocol("§7")
async def test_a_caller_whose_bound_passes_gives_up_and_the_writer_applies_its_write(
    ledger: GatedLedger,
) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(in_thread, ledger.hold)
        await in_thread(ledger.holding.wait)
        with pytest.raises(StepTimedOut, match="recording run-late"):
            await run_bounded(ledger.admit, "run-late", "lane", "{}", 1.0,
                              limit_s=0.2, what="recording run-late")
        assert ledger.statistics().queued == 1
        ledger.release.set()
    # The abandoned caller's write is applied all the same, in the next batch.
    row = await in_thread(ledger.get, "run-late")
    assert row is not None and row.state is RunState.ACCEPTED


async def test_a_non_durable_write_rides_the_next_commit_without_waiting_for_one(
    ledger: GatedLedger,
) -> None:
    ledger.admit("run-1", "lane", "{}", now=1.0)
    ledger.mark_started("run-1", now=2.0)
    ledger.mark_finished("run-1", Outcome(ok=True, reply="done").to_json(), now=3.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(in_thread, ledger.hold)
        await in_thread(ledger.holding.wait)
        before = ledger.commits.counts()
        # Returns although the writer is held: it does not wait for that commit.
        await in_thread(partial_reported(ledger))
        assert ledger.statistics().queued == 1
        ledger.release.set()
    # The writer applied it after the held write, in a commit of its own without
    # an fsync (synchronous=NORMAL: it survives the process, not the machine).
    assert sub(ledger.commits.counts(), before) == (2, 1)
    row = await in_thread(ledger.get, "run-1")
    assert row is not None and row.state is RunState.REPORTED
    assert row.settlement == "delivered: 200"


def partial_reported(ledger: Ledger) -> Callable[[], None]:
    def report() -> None:
        ledger.mark_reported("run-1", "delivered: 200", now=4.0, durable=False)

    return report


async def test_a_flushing_read_sees_a_non_durable_write_still_queued(
    ledger: GatedLedger,
) -> None:
    ledger.admit("run-1", "lane", "{}", now=1.0)
    got: list[UnreportedRuns] = []

    async def recover() -> None:
        got.append(await in_thread(ledger.recover))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(in_thread, ledger.hold)
        await in_thread(ledger.holding.wait)
        await in_thread(partial_reported(ledger))
        nursery.start_soon(recover)
        await in_thread(ledger.wait_queued, 4)  # admit, hold, reported, the flush
        assert got == []  # it waits for the queued write
        ledger.release.set()
    # A drain's question "what is still unreported?" is answered after the queued
    # `reported`, never before it.
    [recovery] = got
    assert (recovery.pending, recovery.interrupted, recovery.outbox) == ([], [], [])


async def test_queue_only_rides_the_writer_at_work_from_the_trio_thread(
    ledger: GatedLedger,
) -> None:
    ledger.admit("run-1", "lane", "{}", now=1.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(in_thread, ledger.hold)
        await in_thread(ledger.holding.wait)
        before = ledger.commits.counts()
        # Called here, in the trio thread: it queues and returns at once although
        # the writer is held (it could not return at all if it waited).
        assert ledger.mark_reported("run-1", "delivered: 200", now=4.0, durable=False,
                                    queue_only=True)
        assert ledger.statistics().queued == 1
        ledger.release.set()
    # The held writer applied it after its own write, without an fsync.
    assert sub(ledger.commits.counts(), before) == (2, 1)
    row = await in_thread(ledger.get, "run-1")
    assert row is not None and row.state is RunState.REPORTED


async def test_queue_only_with_no_writer_at_work_queues_nothing(
    ledger: GatedLedger, path: Path
) -> None:
    ledger.admit("run-1", "lane", "{}", now=1.0)
    before = ledger.statistics()
    # Nobody would apply it: the caller is told to write it the ordinary way.
    assert not ledger.mark_reported("run-1", "delivered: 200", now=4.0, durable=False,
                                    queue_only=True)
    assert ledger.statistics() == before
    assert committed_states(path) == {"run-1": "accepted"}
    # A durable write cannot be queued without waiting for its commit.
    with pytest.raises(LedgerError, match="needs durable=False"):
        ledger.mark_reported("run-1", "delivered: 200", now=4.0, queue_only=True)
    assert ledger.statistics() == before
