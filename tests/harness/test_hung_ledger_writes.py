"""A ledger write that hangs in the writer thread, seen from the wire (issue 27,
points 3 and 6).

- A run answered 503 because its ``accepted`` write outlived its bound is never run
  here, even once the disk answers and the write goes through: 503 tells the server
  to send it elsewhere.
- A redelivery of a run already reported is answered 204 at once while a write
  hangs: its lookup reads what is committed and does not queue behind the write.

Real parts: the reference server on 127.0.0.1, the production harness, its sqlite
ledger with a write that blocks on a ``threading.Event`` inside the writer thread
(:class:`tests.kits.ledger.FaultyLedger`). Time is trio's mock clock: still until
the write hangs, then leaping only while the harness waits (see each test).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
import trio.testing

from prohost.engine.accounts.limits import LimitNotice
from prohost.engine.ledger import Ledger
from prohost.engine.ledger import steps as steps_module
from prohost.engine.ledger import writer as writer_module
from prohost.engine.supervisor.admission import NOT_RECORDED
from prohost.wire.protocol import Ack
from tests.kits import harness as harness_kit
from tests.kits.harness import (
    ack_to,
    agent_command,
    run_body,
    running_harness,
    running_server,
    wait_for_ack,
    wall_clock_bound,
)
from tests.kits.ledger import CommitHangs, Fault, FaultyLedger, hung_until

_T = TypeVar("_T")

#: Bound on every real wait for a thread here (s).
WAIT_S = 30.0
#: The ledger steps' bound here (virtual s): shorter than the heartbeats' 15 s, so
#: that leaping to it does not leap past the connection's silence limit too.
BOUND_S = 5.0


def hanging(monkeypatch: pytest.MonkeyPatch, what: str) -> Fault:
    """From now on the harness's ledger is a real one whose first write ``what``
    hangs (inside the writer's transaction) until the fault is released."""
    fault = Fault(what, "hang")
    monkeypatch.setattr(steps_module, "LEDGER_STEP_TIMEOUT_S", BOUND_S)

    class HungLedger(FaultyLedger):
        pass

    HungLedger.fault = fault
    monkeypatch.setattr(harness_kit, "Ledger", HungLedger)
    return fault


async def timed_ack(mock_clock: trio.testing.MockClock, running: harness_kit.Running,
                    body: dict[str, Any], delivery_id: str) -> tuple[Ack, float]:
    """The ack to ``body`` delivered as ``delivery_id``, and how long it took
    (virtual s). Meanwhile a second of real idleness leaps to the next deadline:
    a lookup that waited behind a hung write would meet its bound (``BOUND_S``)."""
    mock_clock.autojump_threshold = 1.0
    sent = trio.current_time()
    ack = await ack_to(running, body, delivery_id)
    answered = trio.current_time() - sent
    mock_clock.autojump_threshold = float("inf")
    return ack, answered


@pytest.mark.protocol("§3", "§7")
async def test_a_run_answered_503_on_a_hung_write_is_never_run_here(
    tmp_path: Path, mock_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    home = tmp_path / "home"
    fault = hanging(monkeypatch, "admit")
    try:
        async with wall_clock_bound(120), running_server() as server, running_harness(
            server, home, exec_command=agent_command("reply.py", "ran"),
        ) as running:
            assert isinstance(running.ledger, FaultyLedger)
            async with trio.open_nursery() as nursery:
                acked = trio.Event()
                statuses: list[tuple[int, str]] = []

                async def deliver() -> None:
                    ack = await ack_to(running, run_body("r_hung"), "d_hung")
                    statuses.append((ack.status, ack.reason))
                    acked.set()

                nursery.start_soon(deliver)
                await trio.to_thread.run_sync(fault.hanging.wait, WAIT_S)
                # The write hangs in the writer thread: from now on every wait takes
                # its whole bound.
                sent = trio.current_time()
                mock_clock.autojump_threshold = 0
                await acked.wait()
                mock_clock.autojump_threshold = float("inf")
            assert statuses == [(503, NOT_RECORDED)]
            assert trio.current_time() - sent >= BOUND_S
            # The disk answers: the abandoned write goes through now ...
            fault.release.set()
            # ... (recover() first waits for every write queued, that one included)
            found = await trio.to_thread.run_sync(running.ledger.recover)
            assert "r_hung" not in [row.run_id for row in found.pending]
            assert running.harness.held.get("r_hung") is None
    finally:
        fault.release.set()
    # What the next start reads (§7): the run is not there to be run.
    with Ledger.open(home / "ledger.sqlite3") as ledger:
        assert ledger.get("r_hung") is None
        assert ledger.recover().pending == []


def home_with_a_reported_run(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A home whose ledger has run ``r_done`` accepted and reported; that run's body."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    with Ledger.open(home / "ledger.sqlite3") as ledger:
        body = run_body("r_done")
        ledger.admit("r_done", "lane", json.dumps(body), time.time())
        ledger.mark_reported("r_done", "completed: 200", time.time())
    return home, body


@pytest.mark.protocol("§3", "§12")
async def test_a_reported_run_is_answered_204_at_once_while_a_write_hangs(
    tmp_path: Path, mock_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every account limited, so the redelivery is asked of the ledger (a new run
    would get 503); the ledger's writer thread hangs on a write meanwhile."""
    home, body = home_with_a_reported_run(tmp_path)
    fault = hanging(monkeypatch, "save_account_limits")
    try:
        async with wall_clock_bound(120), running_server() as server, running_harness(
            server, home, exec_command=agent_command("reply.py", "ran"),
        ) as running:
            harness = running.harness
            async with trio.open_nursery() as nursery:
                until = time.time() + 3600
                harness.book.report("default", LimitNotice(state="limited", resets_at=until),
                                    time.time())
                # A write for the writer thread that hangs there (whichever comes first).
                nursery.start_soon(harness.steps.save_limits, {"other": until})
                await trio.to_thread.run_sync(fault.hanging.wait, WAIT_S)
                assert harness.admission.unavailable(time.time()) is not None
                ack, answered = await timed_ack(mock_clock, running, body, "d_again")
                assert (ack.status, ack.reason) == (204, "already reported")
                assert answered < BOUND_S
                fault.release.set()
    finally:
        fault.release.set()


@pytest.mark.protocol("§3")
async def test_a_reported_run_is_answered_204_at_once_behind_a_stalled_write_too(
    tmp_path: Path, mock_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """New work is not refused, so the delivery would be a ledger write, queued
    behind the hung one; the writer being stalled, the ledger's last commit answers
    first. (``STALLED_S`` is set to 0 here: real seconds pass only in ms here.)"""
    monkeypatch.setattr(writer_module, "STALLED_S", 0.0)
    home, body = home_with_a_reported_run(tmp_path)
    fault = hanging(monkeypatch, "save_account_limits")
    try:
        async with wall_clock_bound(120), running_server() as server, running_harness(
            server, home, exec_command=agent_command("reply.py", "ran"),
        ) as running:
            harness = running.harness
            async with trio.open_nursery() as nursery:
                nursery.start_soon(harness.steps.save_limits, {"other": time.time() + 60})
                await trio.to_thread.run_sync(fault.hanging.wait, WAIT_S)
                assert harness.admission.unavailable(time.time()) is None
                ack, answered = await timed_ack(mock_clock, running, body, "d_again")
                assert (ack.status, ack.reason) == (204, "already reported")
                assert answered < BOUND_S
                fault.release.set()
    finally:
        fault.release.set()


@pytest.mark.protocol("§3")
@pytest.mark.parametrize("refused", [False, True], ids=["normal state", "accounts limited"])
async def test_a_run_the_ledger_holds_is_answered_200_at_once_while_a_write_hangs(
    tmp_path: Path, mock_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
    refused: bool,
) -> None:
    """Issue 27, point 6, for a run not yet reported: its ``accepted`` row went
    through but its ack did not, so nothing here holds it. Its redelivery while a
    write hangs is answered 200 at once from the last commit, and the run is taken
    on (it runs, once) when the disk answers. In the normal state the delivery
    would be a write, so the last commit answers first once the writer is stalled
    (``STALLED_S`` is 0 here: real seconds pass only in ms); with every account
    limited it is asked of the last commit anyway, stalled or not."""
    if not refused:
        monkeypatch.setattr(writer_module, "STALLED_S", 0.0)
    home = tmp_path / "home"
    fault = hanging(monkeypatch, "save_account_limits")
    gate = harness_kit.Gate()
    try:
        async with wall_clock_bound(120), trio.open_nursery() as outer:
            await outer.start(gate.serve)
            async with running_server() as server, running_harness(
                server, home, exec_command=gate.command,
            ) as running:
                harness = running.harness
                ledger = running.ledger
                assert ledger is not None
                body = run_body("r_known")
                # Recorded by a delivery whose ack never went out: in the ledger's
                # last commit, held by nothing here.
                await trio.to_thread.run_sync(
                    ledger.admit, "r_known", "lane", json.dumps(body), time.time())
                assert harness.held.get("r_known") is None
                if refused:
                    harness.book.report("default", LimitNotice(
                        state="limited", resets_at=time.time() + 3600), time.time())
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(harness.steps.save_limits,
                                       {"other": time.time() + 60})
                    await trio.to_thread.run_sync(fault.hanging.wait, WAIT_S)
                    assert (harness.admission.unavailable(time.time()) is not None) is refused
                    ack, answered = await timed_ack(mock_clock, running, body, "d_again")
                    assert (ack.status, ack.reason) == (200, "already accepted")
                    assert answered < BOUND_S
                    assert gate.started == []
                    # The disk answers: the run is taken on after its ack, and runs
                    # (once an account can take it).
                    fault.release.set()
                if refused:
                    outer.cancel_scope.cancel()
                    return
                await gate.wait_started("r_known")
                await gate.release("r_known")
                assert gate.started == ["r_known"]
            outer.cancel_scope.cancel()
    finally:
        fault.release.set()


class CommitThenWithdrawHangs(CommitHangs):
    """:class:`tests.kits.ledger.CommitHangs` (its first ``admit`` hangs until
    ``release``) whose write that would take a row back afterwards (``withdraw``, as
    prohost once did) hangs for good, so that the moment between the row's commit and
    any later one stays open. A subclass names all four events on the class."""

    later: threading.Event  # a write after the admit hangs: the gap is open
    never: threading.Event

    def _write(self, fn: Callable[[sqlite3.Connection], _T], *, what: str,
               durable: bool = True, waits: bool | None = None) -> _T:
        if what == "withdraw":
            fn = hung_until(fn, self.later, self.never)
        return super()._write(fn, what=what, durable=durable, waits=waits)

    def _queue_behind_writer(self, fn: Callable[[sqlite3.Connection], Any], *,
                             what: str) -> bool:
        if what == "withdraw":
            fn = hung_until(fn, self.later, self.never)
        return super()._queue_behind_writer(fn, what=what)


async def _harness_until_cancelled(
    server: harness_kit.ServerHandle, home: Path, command: str, *,
    task_status: trio.TaskStatus[harness_kit.Running] = trio.TASK_STATUS_IGNORED,
) -> None:
    """A running harness on ``home`` (its agents ``command``) until cancelled."""
    async with running_harness(server, home, exec_command=command) as running:
        task_status.started(running)
        await trio.sleep_forever()


@pytest.mark.protocol("§3", "§7")
async def test_a_delivery_is_never_answered_503_while_its_row_may_still_land(
    tmp_path: Path, mock_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 27, point 3, the crash gap: the ``accepted`` write's own transaction is
    under way when its bound passes. Were the delivery answered 503 then, the row
    could land when the disk answers and a ``kill -9`` before any later commit (the
    files copied at that moment, as the kill leaves them) would have the next start
    run a run the server was told to send elsewhere. The ack waits for the disk
    instead: 200 once the row landed, and the next start agrees."""
    monkeypatch.setattr(steps_module, "LEDGER_STEP_TIMEOUT_S", BOUND_S)

    class Hung(CommitThenWithdrawHangs):
        holding, release = threading.Event(), threading.Event()
        later, never = threading.Event(), threading.Event()

    monkeypatch.setattr(harness_kit, "Ledger", Hung)
    home, after_kill = tmp_path / "home", tmp_path / "after-kill"
    statuses: list[int] = []
    try:
        async with wall_clock_bound(120), running_server() as server:
            # The run, once taken on, waits at the gate: never done before the "kill".
            gate = harness_kit.Gate()
            async with trio.open_nursery() as gates:
                await gates.start(gate.serve)
                running = await gates.start(_harness_until_cancelled, server, home,
                                            gate.command)
                async with trio.open_nursery() as nursery:
                    async def deliver() -> None:
                        ack = await ack_to(running, run_body("r_gap"), "d_gap")
                        statuses.append(ack.status)

                    nursery.start_soon(deliver)
                    await trio.to_thread.run_sync(Hung.holding.wait, WAIT_S)
                    # Past the bound (and twice over): no answer is true yet.
                    mock_clock.autojump_threshold = 0
                    await trio.sleep(2 * BOUND_S)
                    mock_clock.autojump_threshold = float("inf")
                    before_the_disk_answered = list(statuses)
                    Hung.release.set()  # the disk answers: the row lands
                    # Then either the ack comes, or a write after the row hangs.
                    async with trio.open_nursery() as race:
                        async def acked() -> None:
                            if before_the_disk_answered:
                                await trio.sleep_forever()  # answered: wait for the gap
                            await wait_for_ack(server, "d_gap")
                            race.cancel_scope.cancel()

                        async def gap_open() -> None:
                            await trio.to_thread.run_sync(Hung.later.wait, WAIT_S,
                                                          abandon_on_cancel=True)
                            race.cancel_scope.cancel()

                        race.start_soon(acked)
                        race.start_soon(gap_open)
                    # kill -9 now: what the next start finds is the files as they are.
                    after_kill.mkdir(mode=0o700)
                    for name in ("ledger.sqlite3", "ledger.sqlite3-wal"):
                        shutil.copy2(home / name, after_kill / name)
                    nursery.cancel_scope.cancel()
                Hung.never.set()
                gates.cancel_scope.cancel()
        monkeypatch.setattr(harness_kit, "Ledger", Ledger)
        async with wall_clock_bound(120), running_server() as server, running_harness(
            server, after_kill, exec_command=agent_command("reply.py", "ran"),
        ) as restarted:
            runs_it = restarted.harness.held.get("r_gap") is not None
    finally:
        Hung.release.set()
        Hung.never.set()
    # The ack and the next start agree: a run answered 503 is not taken on.
    assert (503 in statuses) is not runs_it
    assert before_the_disk_answered == []
    assert statuses == [200] and runs_it
