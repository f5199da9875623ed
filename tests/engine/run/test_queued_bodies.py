"""A run that starts at once keeps the body it was parsed from at admission; only a
run that really waits is queued light (its body parsed again, or read back from the
ledger, when it starts).

Real parts: the reference server on 127.0.0.1, the production harness, the sqlite
ledger and real agent subprocesses (tests/agents).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from prohost.engine.lanes.scheduler import Scheduler, Slot
from prohost.engine.ledger import Ledger, LedgerError
from tests.kits.harness import (
    agent_command,
    finished,
    gated_harness,
    running_harness,
    running_server,
)


class BodyUnreadable:
    """The ledger, but no run's body can be read back (a failing disk sector)."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self.reads = 0

    def body(self, run_id: str) -> str | None:
        self.reads += 1
        raise LedgerError("disk I/O error on a read (test)")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)


async def test_a_run_that_starts_at_once_never_reads_its_body_back(tmp_path: Path) -> None:
    """Past the budget for queued texts, on a disk whose body reads fail: a run
    delivered to an idle harness still runs and answers, since it starts with the
    body it was admitted with. (Before, every run dropped it on the way through the
    queue, and this one was reported as an internal error.)"""
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=agent_command("reply.py", "ran"),
        ) as running:
            ledger = running.ledger
            runner = running.harness.runner
            assert ledger is not None and runner is not None
            unreadable = BodyUnreadable(ledger)
            runner.steps.ledger = unreadable  # type: ignore[assignment]
            running.harness.bodies.budget = 0  # a queued body would be read back
            run_id = await server.submit_run("start me now", conversation_id="C1")
            await server.wait_until(finished(run_id))
            completion = server.run(run_id).completion
            assert completion is not None
            assert completion["ok"] is True, completion
            assert completion["reply"] == "ran"
            assert unreadable.reads == 0


async def test_runs_waiting_for_a_slot_are_held_light(tmp_path: Path) -> None:
    """One slot, taken by a running agent: the runs delivered meanwhile wait, and
    each is held without its parsed body until it starts; then each runs whole."""
    with trio.fail_after(60):
        async with gated_harness(tmp_path, concurrency=1) as (gate, running):
            harness, server = running.harness, running.server
            first = await server.submit_run("first", conversation_id="A")
            await gate.wait_started(first)
            waiting = [await server.submit_run(f"then {n}", conversation_id=f"L{n}")
                       for n in range(3)]
            await server.wait_until(
                lambda s: all(s.runs[r].state == "accepted" for r in waiting))
            assert all(harness.held[r].body is None for r in waiting)
            await gate.release(first)
            for run_id in waiting:
                await gate.wait_started(run_id)
                await gate.release(run_id)
            await server.wait_until(finished(first, *waiting))
            assert all(server.run(r).completion["reply"] == "done" for r in waiting)


@pytest.mark.protocol("§4")
async def test_at_most_limit_runs_submitted_to_start_at_once_can_wait() -> None:
    """What the scheduler promises to the run queue: an item "starts at once" only
    while fewer items wait than slots are free, on a lane with nothing running,
    waiting or holding it; so no more than ``limit`` of them can be kept whole."""

    async def work(key: str, item: str, slot: Slot) -> None:
        await trio.sleep_forever()

    scheduler: Scheduler[str] = Scheduler(2, work)
    # Not dispatching (no run() task): everything submitted stays waiting.
    assert scheduler.starts_at_once("A")
    scheduler.submit("r1", "A", "r1")
    assert not scheduler.starts_at_once("A")  # its lane has a run in line
    assert scheduler.starts_at_once("B")
    scheduler.submit("r2", "B", "r2")
    assert not scheduler.starts_at_once("C")  # both slots are spoken for
    assert scheduler.remove("r2") == "r2"
    assert scheduler.starts_at_once("C")
    assert scheduler.settle("c0", "C", "c0")
    assert not scheduler.starts_at_once("C")  # a report in line holds it
    assert scheduler.remove("c0") == "c0"
    assert scheduler.starts_at_once("C")
