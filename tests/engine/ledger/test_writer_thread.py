"""The ledger's one writer thread (issue 19): a harness's ledger writes go to one
long-lived thread, woken from and waking trio without a worker-thread hop per
step; the thread is started and joined by the harness, even on a hung disk within
its bound; and sync callers keep working beside it.

Real parts only: the reference server, the production harness, an agent
subprocess, a real sqlite file, real threads (held on ``threading.Event``s).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from prohost.engine.blocking import Bounds
from prohost.engine.ledger import Admitted, Ledger, LedgerError, RunState, _Write
from prohost.engine.ledger.steps import LedgerSteps
from tests.kits import harness as harness_kit
from tests.kits.harness import agent_command, finished, running_harness, running_server

WRITER = "prohost ledger writer"
#: Bound on every wait for a thread here (s); nothing here takes long.
WAIT_S = 30.0


def writer_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == WRITER]


class WatchedLedger(Ledger):
    """A real ledger that notes which thread applied each batch of writes."""

    appliers: list[str]

    def _apply(self, batch: list[_Write], *, force_durable: bool = False) -> None:
        self.appliers.append(threading.current_thread().name)
        super()._apply(batch, force_durable=force_durable)


class HeldLedger(Ledger):
    """A real ledger whose ``prune`` is one write, ``held``, that may block (a hung
    disk) inside the writer's transaction."""

    held: Callable[[sqlite3.Connection], Any]

    def prune(self, now: float, older_than_s: float = 0.0,
              forget_after_s: float = 0.0) -> Any:
        return self._write(self.held, what="prune")


async def test_a_runs_ledger_writes_go_to_the_one_writer_thread_without_a_hop_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hops: list[str] = []
    to_thread = trio.to_thread.run_sync

    async def counting(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        hops.append(getattr(fn, "__name__", repr(fn)))
        return await to_thread(fn, *args, **kwargs)

    monkeypatch.setattr(trio.to_thread, "run_sync", counting)
    monkeypatch.setattr(WatchedLedger, "appliers", [], raising=False)
    monkeypatch.setattr(harness_kit, "Ledger", WatchedLedger)
    home = tmp_path / "home"
    async with running_server() as server:
        async with running_harness(server, home, exec_command=agent_command("reply.py", "done"),
                                   concurrency=1) as running:
            assert len(writer_threads()) == 1
            run_id = await server.submit_run("hello", conversation_id="C1")
            await server.wait_until(finished(run_id))
            await running.harness.wait_until(lambda h: run_id not in h.held)
            assert isinstance(running.ledger, WatchedLedger)
            during = list(running.ledger.appliers)
        # Joined by the harness on its way out.
        assert writer_threads() == []
        with Ledger.open(home / "ledger.sqlite3") as ledger:
            row = ledger.get(run_id)
            assert row is not None and row.state is RunState.REPORTED
    assert server.run(run_id).completion_posts == 1
    # Every write of the run (accepted, started, group, finished, reported)
    # was applied by the writer thread, and none took a worker thread.
    assert during and set(during) == {WRITER}
    ledger_hops = {"admit", "mark_started", "record_pgid", "mark_finished", "mark_reported",
                   "save_turn", "save_account_limits", "prune",
                   "_turn_then_finished", "_started_then_session"}
    assert [hop for hop in hops if hop in ledger_hops] == []


async def test_sync_callers_keep_working_beside_the_writer_thread_and_after_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.sqlite3"
    with Ledger.open(path) as ledger:
        steps = LedgerSteps(ledger, Bounds())
        async with trio.open_nursery() as nursery:
            await nursery.start(steps.writer)
            assert ledger.serving
            # From trio, through the thread; from a worker thread, the sync call.
            admitted = await steps.admit("run-1", "lane", "{}")
            assert admitted is Admitted.NEW
            with trio.fail_after(WAIT_S):
                second = await trio.to_thread.run_sync(ledger.admit, "run-2", "lane", "{}",
                                                       2.0)
            assert second is Admitted.NEW
            nursery.cancel_scope.cancel()
        assert not ledger.serving and writer_threads() == []
        # Nothing serves now: the caller is the writer, as before.
        assert ledger.admit("run-3", "lane", "{}", 3.0) is Admitted.NEW
        await steps.started("run-3", "lane", "default")
    with sqlite3.connect(path) as other:
        states = dict(other.execute("SELECT run_id, state FROM runs").fetchall())
    assert states == {"run-1": "accepted", "run-2": "accepted", "run-3": "started"}


@pytest.mark.protocol("§7", "§9")
async def test_a_writer_thread_held_by_a_hung_disk_does_not_hold_the_exit(
    tmp_path: Path, mock_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture,
) -> None:
    """The step gives up at its bound; the join gives up at the second signal's
    deadline and says so; the thread ends on its own once the disk answers, having
    applied the write."""
    path = tmp_path / "ledger.sqlite3"
    release = threading.Event()
    holding = threading.Event()

    def hang(conn: sqlite3.Connection) -> None:
        holding.set()
        release.wait(WAIT_S)
        conn.execute("INSERT INTO runs (run_id, lane, body, state, accepted_at) "
                     "VALUES ('late', 'lane', '{}', 'accepted', 1.0)")

    ledger = HeldLedger.open(path)
    ledger.held = hang
    try:
        bounds = Bounds()
        steps = LedgerSteps(ledger, bounds)
        gave_up: list[BaseException] = []
        async with trio.open_nursery() as nursery:
            await nursery.start(steps.writer)

            async def step() -> None:
                try:
                    await steps.prune(1.0)  # the hung write
                except TimeoutError as exc:
                    gave_up.append(exc)

            started = trio.current_time()
            async with trio.open_nursery() as steps_nursery:
                steps_nursery.start_soon(step)
                # The clock stands still until the write hangs in the writer thread;
                # from then on it leaps whenever every task waits (for that thread).
                await trio.to_thread.run_sync(holding.wait, WAIT_S)
                mock_clock.autojump_threshold = 0
            assert gave_up and trio.current_time() - started == pytest.approx(30.0)
            bounds.hurry(trio.current_time() + 5.0)
            stopped_at = trio.current_time()
            nursery.cancel_scope.cancel()
        assert trio.current_time() - stopped_at <= 5.0
        assert "writer thread is still busy" in caplog.text
        [thread] = writer_threads()
        release.set()
        with trio.fail_after(WAIT_S):
            await trio.to_thread.run_sync(thread.join, WAIT_S)
        assert not thread.is_alive() and not ledger.serving
    finally:
        release.set()
        ledger.close()
    with Ledger.open(path) as reopened:
        row = reopened.get("late")
        assert row is not None and row.state is RunState.ACCEPTED


async def test_a_step_waiting_on_the_writer_thread_is_not_interrupted_by_a_cancel(
    tmp_path: Path,
) -> None:
    """An ordinary cancel lets a step that was begun finish (it is shielded), as a
    worker-thread step did."""
    release = threading.Event()
    holding = threading.Event()

    def slow(conn: sqlite3.Connection) -> str:
        holding.set()
        release.wait(WAIT_S)
        return "done"

    with HeldLedger.open(tmp_path / "ledger.sqlite3") as ledger:
        ledger.held = slow
        steps = LedgerSteps(ledger, Bounds())
        results: list[str] = []
        async with trio.open_nursery() as writer:
            await writer.start(steps.writer)
            async with trio.open_nursery() as nursery:

                async def step() -> None:
                    results.append(await steps.prune(1.0))  # slow

                nursery.start_soon(step)
                with trio.fail_after(WAIT_S):
                    await trio.to_thread.run_sync(holding.wait, WAIT_S)
                nursery.cancel_scope.cancel()
                release.set()
            writer.cancel_scope.cancel()
        assert results == ["done"]



def _half_then_fail(conn: sqlite3.Connection) -> None:
    """A write whose first statement lands and whose second fails (a constraint)."""
    conn.execute("INSERT INTO lane_accounts VALUES ('half', 'a', 1.0)")
    conn.execute("INSERT INTO lane_accounts VALUES ('half', 'b', 2.0)")  # same lane


def _lanes(path: Path) -> set[str]:
    with sqlite3.connect(path) as other:
        return {lane for (lane,) in other.execute("SELECT lane FROM lane_accounts")}


@pytest.mark.protocol("§7")
async def test_a_write_that_fails_half_way_leaves_nothing_alone_or_in_a_batch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """A batch of one write has no savepoint of its own (issue 19: two statements
    fewer per step at rest): its transaction is rolled back instead, so what the
    write did before it failed is gone, its caller gets the error (not a log line),
    and the next write commits. Beside other writes, only the failed one is undone."""
    path = tmp_path / "ledger.sqlite3"
    with Ledger.open(path) as ledger:
        # Alone, from a caller's own thread (it leads the group commit).
        with pytest.raises(LedgerError, match="UNIQUE"):
            ledger._write(_half_then_fail, what="half", durable=True)
        assert _lanes(path) == set()
        assert ledger.admit("run-1", "lane", "{}", 1.0) is Admitted.NEW
        # Alone, through the writer thread, for a trio caller.
        steps = LedgerSteps(ledger, Bounds())
        async with trio.open_nursery() as nursery:
            await nursery.start(steps.writer)
            assert ledger.serving
            with pytest.raises(LedgerError, match="UNIQUE"):
                await steps._write(partial(ledger._write, what="half", durable=True),
                                   _half_then_fail, what="half")
            assert _lanes(path) == set()
            nursery.cancel_scope.cancel()
        # Beside another write in one batch: the other one stays.
        ledger._write(lambda conn: None, what="hold", durable=False, waits=False)
        batch = [_Write(_half_then_fail, "half", durable=True, waits=False),
                 _Write(lambda conn: conn.execute(
                     "INSERT INTO lane_accounts VALUES ('kept', 'a', 3.0)"),
                     "kept", durable=True, waits=False)]
        with ledger._lock:
            ledger._apply(batch)
        assert batch[0].error is not None and batch[1].error is None
        assert _lanes(path) == {"kept"}
    # Only the batch writes nobody waited for were logged; the callers got theirs.
    assert [r.getMessage() for r in caplog.records if "UNIQUE" in r.getMessage()] == [
        f"ledger: {batch[0].error} (in half, which did not wait for its commit)"]
