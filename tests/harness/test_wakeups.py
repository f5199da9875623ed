"""Every wake-up of the harness's waiters (``Harness.changed``) is for a change they
can see: a run's way from delivery to its settled report wakes them once per step,
never twice for the same picture.

Real parts: the reference server on 127.0.0.1, the production harness, the sqlite
ledger and a real agent subprocess.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import trio

from prohost.engine.harness import Harness
from tests.kits.harness import agent_command, finished, running_harness, running_server


def picture(harness: Harness) -> tuple[Any, ...]:
    """What a waiter (the panel, a drain, a test's wait_until) can look at."""
    return (tuple((run_id, held.state) for run_id, held in harness.held.items()),
            harness.scheduler.statistics(), harness.link.statistics().connected)


async def test_a_run_wakes_the_waiters_once_per_change_and_every_step_is_seen(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=agent_command("reply.py", "ran"),
        ) as running:
            harness = running.harness
            seen: list[tuple[Any, ...]] = []
            notify = harness.state_changed.notify

            def noting() -> None:
                seen.append(picture(harness))
                notify()

            harness.state_changed.notify = noting  # type: ignore[method-assign]
            before = picture(harness)
            run_id = await server.submit_run("hello", conversation_id="C1")
            # A waiter for the slot's release (the run still reporting) is woken.
            await harness.wait_until(lambda h: run_id not in h.held or
                                     h.held[run_id].state == "reporting")
            await server.wait_until(finished(run_id))
            await harness.wait_until(lambda h: run_id not in h.held)
    pictures = [before, *seen]
    repeated = [now for was, now in itertools.pairwise(pictures) if was == now]
    assert not repeated, f"woken with nothing changed: {repeated}"
    states = [dict(p[0]).get(run_id) for p in seen]
    # Held (queued), running, reporting, and let go: each step was told.
    for state in ("queued", "running", "reporting", None):
        assert state in states, states
