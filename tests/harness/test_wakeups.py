"""Every wake-up of the harness's waiters (``Harness.state_changed``) is for a change they
can see: a run's way from delivery to its settled report wakes them once per step,
never twice for the same picture.

Real parts: the reference server on 127.0.0.1, the production harness, the sqlite
ledger and a real agent subprocess.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import trio

from prohost.engine.changes import Changes
from prohost.engine.harness import Harness
from tests.kits.harness import agent_command, finished, running_harness, running_server


def picture(harness: Harness) -> tuple[Any, ...]:
    """What a waiter (the panel, a drain, a test's wait_until) can look at."""
    return (tuple((run_id, held.state) for run_id, held in harness.held.items()),
            harness.scheduler.statistics(), harness.link.statistics().connected)


async def test_a_run_wakes_the_waiters_once_per_change_and_every_step_is_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[Any, ...]] = []
    watched: list[Harness] = []
    notify = Changes.notify

    def noting(changes: Changes) -> None:
        # Every part is handed the notice's bound method when the harness is built,
        # so it is counted on the class, for the watched harness's notice only.
        if watched and changes is watched[0].state_changed:
            seen.append(picture(watched[0]))
        notify(changes)

    monkeypatch.setattr(Changes, "notify", noting)
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=agent_command("reply.py", "ran"),
        ) as running:
            harness = running.harness
            watched.append(harness)
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
