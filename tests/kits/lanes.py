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
