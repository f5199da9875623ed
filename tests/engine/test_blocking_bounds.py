"""Bounds that hold when a blocking step hangs (issue 8, reproduction 4).

The hanging steps here really block a worker thread, on a ``threading.Event``
that is only set when the test is over: nothing in them ever returns on its own.
Timing uses trio's autojump clock, so bounds of 30 s pass without waiting and no
test measures wall-clock speed.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.lowlevel
import trio.testing

from prohost.engine.blocking import Bounds, StepTimedOut, run_bounded
from prohost.engine.harness import Harness
from prohost.engine.ledger import Ledger, LedgerError, RunState
from prohost.engine.ledger import writer as ledger_module
from prohost.options import Options
from tests.kits.harness import (
    Gate,
    endpoints_for,
    finished,
    pair_home,
    running_harness,
    running_server,
    wait_rescued_late,
)


@pytest.fixture
def hang() -> Iterator[threading.Event]:
    """Set at teardown only: whatever waits on it hangs for the whole test."""
    event = threading.Event()
    yield event
    event.set()


async def test_a_step_that_never_returns_is_abandoned_at_its_bound(
    hang: threading.Event, autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    started = trio.current_time()
    with pytest.raises(StepTimedOut, match="writing the test file did not finish"):
        await run_bounded(hang.wait, limit_s=30, what="writing the test file")
    assert trio.current_time() - started == pytest.approx(30)
    assert "writing the test file took over 30.0 s" in caplog.text


async def test_a_cancel_does_not_interrupt_a_step_that_finishes() -> None:
    # The real clock: with autojump, the moment the released thread takes to return
    # would count as idle, and the clock would leap to the step's bound.
    release = threading.Event()
    results: list[str] = []

    def step() -> str:
        release.wait()
        return "written"

    with trio.CancelScope() as outer:
        async with trio.open_nursery() as nursery:

            async def run_step() -> None:
                results.append(await run_bounded(step, limit_s=30, what="a step"))
                await trio.lowlevel.checkpoint()  # the outer cancel lands here, after the step

            nursery.start_soon(run_step)
            await trio.testing.wait_all_tasks_blocked()
            outer.cancel()
            # Cancelled from outside, yet the step is still waited for.
            release.set()
    assert results == ["written"]
    assert outer.cancelled_caught


@pytest.mark.protocol("§9")
async def test_hurry_cuts_short_steps_in_flight_and_later_ones(
    hang: threading.Event, autojump_clock: trio.testing.MockClock,
) -> None:
    bounds = Bounds()
    failures: list[float] = []
    async with trio.open_nursery() as nursery:

        async def run_step() -> None:
            with pytest.raises(StepTimedOut):
                await bounds.run(hang.wait, limit_s=1000, what="a hung step")
            failures.append(trio.current_time())

        nursery.start_soon(run_step)
        await trio.testing.wait_all_tasks_blocked()
        deadline = trio.current_time() + 5
        bounds.hurry(deadline)
    assert failures == [pytest.approx(deadline)]
    # Later steps cannot outlast the deadline either, and a later hurry never extends it.
    bounds.hurry(deadline + 100)
    with pytest.raises(StepTimedOut):
        await bounds.run(hang.wait, limit_s=1000, what="another hung step")
    assert trio.current_time() == pytest.approx(deadline)
    # Another harness's steps are not hurried. (Without autojump now: a task waiting
    # for a thread counts as idle, and the clock would leap to the bound.)
    autojump_clock.autojump_threshold = math.inf
    assert await Bounds().run(lambda: "fine", limit_s=1, what="a quick step") == "fine"


class HungLedger(Ledger):
    """A real ledger whose chosen step hangs inside the ledger's lock, as on a dead disk."""

    hang: threading.Event
    #: Set once the hung step holds the lock.
    holding: threading.Event

    def mark_finished(self, run_id: str, outcome_json: str, now: float) -> None:
        with self._lock:
            self.holding.set()
            self.hang.wait()
        super().mark_finished(run_id, outcome_json, now)


def hung_ledger(path: Path, hang: threading.Event) -> HungLedger:
    ledger = HungLedger.open(path)
    ledger.hang = hang
    ledger.holding = threading.Event()
    return ledger


@pytest.mark.protocol("§7")
def test_a_step_waits_for_an_abandoned_one_only_a_bounded_time(
    tmp_path: Path, hang: threading.Event, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The next step gives up rather than share the connection with the hung one."""
    monkeypatch.setattr(ledger_module, "LOCK_WAIT_S", 0.05)
    monkeypatch.setattr(ledger_module, "CLOSE_WAIT_S", 0.05)
    ledger = hung_ledger(tmp_path / "ledger.sqlite3", hang)
    ledger.admit("run-1", "lane", "{}", now=1.0)
    hung = threading.Thread(target=ledger.mark_finished, args=("run-1", "{}", 2.0), daemon=True)
    hung.start()
    try:
        ledger.holding.wait()
        with pytest.raises(LedgerError, match="still busy with an earlier step"):
            ledger.admit("run-2", "lane", "{}", now=3.0)
        # Nor can it hold the process's exit: close gives up and says so.
        ledger.close()
        assert "still busy with a step that never finished" in caplog.text
    finally:
        hang.set()
        hung.join()
        ledger.close()
    # The file is whole: the hung step finished once the disk "answered".
    with Ledger.open(tmp_path / "ledger.sqlite3") as reopened:
        row = reopened.get("run-1")
        assert row is not None and row.state is RunState.FINISHED


@pytest.mark.protocol("§7", "§9")
async def test_the_second_signal_exits_130_in_its_window_with_a_hung_ledger(
    tmp_path: Path, hang: threading.Event, mock_clock: trio.testing.MockClock,
) -> None:
    """A run's outbox write hangs for good after the second signal: the harness still
    exits 130 at the end of its 5 s window, and the run is left in the ledger for the
    next start, which reports it."""
    # The clock stands still until the second signal (every ledger call is a worker
    # thread, and a task waiting for one counts as idle, so autojump would make each
    # "take" its bound). From the signal on it leaps whenever every task waits, so
    # each wait takes its whole bound, and the window is checked against the worst
    # case. A harness waiting for the hung thread would never exit: the rescuer
    # releases the disk after 60 virtual seconds, failing the assertion instead.
    assert mock_clock.autojump_threshold == math.inf
    home = tmp_path / "home"
    path = home / "ledger.sqlite3"
    gate = Gate()
    async with trio.open_nursery() as gate_nursery:
        await gate_nursery.start(gate.serve)
        async with running_server() as server:
            creds = pair_home(server, home)
            ledger = hung_ledger(path, hang)
            try:
                options = Options(home=home, machine="test", exec_command=gate.command)
                async with httpx.AsyncHTTPTransport() as client:
                    harness = Harness(options, endpoints_for(creds), client=client,
                                      ledger=ledger)
                    codes: list[int] = []
                    exited = trio.Event()
                    async with trio.open_nursery() as nursery:

                        async def run_it(*, task_status: Any) -> None:
                            codes.append(await harness.run(task_status=task_status))
                            exited.set()

                        await nursery.start(run_it)
                        run_id = await server.submit_run("long")
                        await gate.wait_started(run_id)
                        harness.drain()
                        signalled = trio.current_time()
                        harness.stop()
                        await wait_rescued_late(nursery, mock_clock, exited, hang.set)
                    mock_clock.autojump_threshold = math.inf
                    assert codes == [130]
                    assert trio.current_time() - signalled <= 5.0 + 1e-6
            finally:
                # The hung thread still holds the lock: release it before closing.
                hang.set()
                ledger.close()
            with Ledger.open(path) as reopened:
                row = reopened.get(run_id)
                assert row is not None and row.state is not RunState.REPORTED
            assert server.run(run_id).completion is None

            # The next start finds it and reports it.
            async with running_harness(server, home, exec_command=gate.command):
                await server.wait_until(finished(run_id))
            completion = server.run(run_id).completion
            assert completion is not None and completion["ok"] is False
            assert completion["retryable"] is True
        gate_nursery.cancel_scope.cancel()


@pytest.fixture(autouse=True)
def _quiet_http(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="httpx")
