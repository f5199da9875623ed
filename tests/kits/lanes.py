"""Waits on a lane scheduler, built on its public state."""

from __future__ import annotations

from typing import Any

import trio.testing

from prohost.engine.lanes.scheduler import Scheduler


async def until_idle(scheduler: Scheduler[Any]) -> None:
    """Return once every task is blocked, and check that the scheduler then has
    nothing running, reporting or queued (work that is blocked on something the
    test still has to release is a failure, not a wait)."""
    await trio.testing.wait_all_tasks_blocked()
    figures = scheduler.statistics()
    assert (figures.running, figures.reporting, figures.queued) == (0, 0, 0), figures


class SettleLog(Scheduler[Any]):
    """A scheduler that is never run, as admission and recovery tests build one: it
    keeps, in order, every run settled on it (a run that only needs reporting), as
    ``(run_id, outcome, recorded, finished_at)``, and nothing ever executes."""

    def __init__(self) -> None:
        super().__init__(2, _nothing_runs, queue_cap=100)
        self.settled: list[tuple[str, Any, bool, float | None]] = []

    def settle(self, key: str, lane: str, item: Any) -> bool:
        settled = super().settle(key, lane, item)
        if settled:
            self.settled.append((item.held.run_id, item.outcome, item.recorded,
                                 item.finished_at))
        return settled


async def _nothing_runs(key: str, item: Any, slot: Any) -> None:
    raise AssertionError("nothing runs in these tests")
