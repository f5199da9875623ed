"""When the live panel draws: what changed at once, a shown clock once a second, and
an unchanged picture never again (issue 19: an idle harness on a terminal must cost
next to nothing, and send the terminal next to nothing).

The panel is driven on a recording terminal console under trio's mock clock; what
a person sees is what reached that console.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import attrs
import trio
import trio.testing
from rich.console import Console

from prohost.engine.changes import Changes
from prohost.engine.view.panel import CLOCK_TICK_S, LIVE_REFRESH_S, Panel, shown
from prohost.engine.view.snapshot import FinishedRow, RunRow, Snapshot
from tests.kits.panel import T0, base, busy_snapshot, recording_console


def frames(console: Console) -> int:
    """Frames drawn so far: each one repaints the whole panel, header first."""
    return console.export_text(clear=False).count("studio-mac")


def written(console: Console) -> int:
    """Characters sent to the terminal so far (frames and cursor moves)."""
    return len(console.file.getvalue())  # type: ignore[attr-defined]


@asynccontextmanager
async def live_panel(source: Callable[[], Snapshot],
                     changes: Changes | None = None) -> AsyncIterator[Console]:
    """A live panel drawing ``source`` on a recording terminal for as long as the
    block runs; the block gets the terminal."""
    console = recording_console(force_terminal=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(Panel(console, source, live=True,
                                  changes=Changes() if changes is None else changes).run)
        yield console
        nursery.cancel_scope.cancel()


async def test_an_unchanged_picture_is_never_drawn_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Nothing that is shown moves: no heartbeat yet, no runs, nothing finished.
    async with live_panel(lambda: base(heartbeat_age_s=None)) as console:
        before = written(console)
        await trio.sleep(60)
        assert written(console) == before  # the terminal was sent nothing at all


async def test_an_idle_panel_draws_each_tick_of_its_heartbeat_age_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    began = trio.current_time()

    def source() -> Snapshot:
        # As the harness's: the age grows with trio's clock (a heartbeat at began - 0.5).
        return base(heartbeat_age_s=trio.current_time() - began + 0.5)

    async with live_panel(source) as console:
        await trio.sleep(10 * CLOCK_TICK_S + 0.1)
        text = console.export_text(clear=False)
        # Every second of the age reached the screen, in order...
        seen = [text.index(f"heartbeat {n} s ago") for n in range(11)]
        assert seen == sorted(seen)
        # ...once each: a frame per second, not one every LIVE_REFRESH_S.
        assert frames(console) == 11


async def test_a_change_notice_is_drawn_at_once_and_a_burst_at_most_every_refresh(
    autojump_clock: trio.testing.MockClock,
) -> None:
    current = base(heartbeat_age_s=None)
    changes = Changes()
    async with live_panel(lambda: current, changes) as console:
        await trio.sleep(LIVE_REFRESH_S + 0.05)  # just after a look: the next tick is far
        current = base(heartbeat_age_s=None, queued=1)
        changes.notify()
        await trio.testing.wait_all_tasks_blocked()
        assert "queued 1" in console.export_text(clear=False)  # no wait for the tick
        # A busy harness notifies at every step: 100 changes in one second...
        drawn = frames(console)
        for queued in range(2, 102):
            current = base(heartbeat_age_s=None, queued=queued)
            changes.notify()
            await trio.sleep(0.01)
        await trio.sleep(LIVE_REFRESH_S)
        # ...are at most a frame every LIVE_REFRESH_S, the last one current.
        assert frames(console) - drawn <= (1 + LIVE_REFRESH_S) / LIVE_REFRESH_S + 1
        assert "queued 101" in console.export_text(clear=False)


async def test_a_notice_made_while_the_panel_looks_is_drawn_at_the_next_refresh(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A change made after a look began, before the panel waits again (here the look
    # itself makes it, there being no checkpoint in between): its notice must wake
    # the next wait, not be lost until the clock's tick a second later.
    changes = Changes()
    queued, later = 0, [2]

    def source() -> Snapshot:
        nonlocal queued
        looked_at = base(heartbeat_age_s=None, queued=queued)
        if queued == 1 and later:
            queued = later.pop()
            changes.notify()
        return looked_at

    async with live_panel(source, changes) as console:
        await trio.sleep(LIVE_REFRESH_S + 0.05)  # just after a look: the next tick is far
        queued = 1
        changes.notify()
        await trio.testing.wait_all_tasks_blocked()
        assert "queued 1" in console.export_text(clear=False)
        await trio.sleep(LIVE_REFRESH_S + 0.05)
        assert "queued 2" in console.export_text(clear=False)


async def test_an_idle_panel_looks_once_a_tick_again_after_a_notice(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A notice is seen once: the panel does not go on looking every LIVE_REFRESH_S
    # as if it were still new (issue 19: an idle harness costs next to nothing).
    looks = 0

    def source() -> Snapshot:
        nonlocal looks
        looks += 1
        return base(heartbeat_age_s=None)

    changes = Changes()
    async with live_panel(source, changes):
        await trio.sleep(LIVE_REFRESH_S + 0.05)
        changes.notify()
        await trio.testing.wait_all_tasks_blocked()
        looks = 0
        await trio.sleep(10 * CLOCK_TICK_S + 0.1)
        assert looks == 10  # one a tick, not four


async def test_a_change_without_a_notice_is_drawn_within_a_tick(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # E.g. an account's limit running out: the clock, not a notice, changes the state.
    current = base(heartbeat_age_s=None)
    async with live_panel(lambda: current) as console:
        await trio.sleep(0.1)
        current = base(heartbeat_age_s=None, machine="renamed-mac")
        await trio.sleep(CLOCK_TICK_S)
        assert "renamed-mac" in console.export_text(clear=False)


async def test_a_resized_terminal_is_drawn_again_within_a_tick(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with live_panel(lambda: base(heartbeat_age_s=None)) as console:
        drawn = frames(console)
        await trio.sleep(0.1)
        console.width = 60
        await trio.sleep(CLOCK_TICK_S)
        assert frames(console) == drawn + 1


async def test_a_running_agents_activity_is_drawn_within_a_refresh(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Its activity changes with every line the agent prints, and no notice is sent.
    current = busy_snapshot()
    async with live_panel(lambda: current) as console:
        await trio.sleep(0.05)
        first, *rest = current.runs
        current = attrs.evolve(current, runs=(
            attrs.evolve(first, activity="Read docs/NEW.md"), *rest))
        await trio.sleep(LIVE_REFRESH_S)
        assert "Read docs/NEW.md" in console.export_text(clear=False)


def test_shown_differs_exactly_when_the_picture_does() -> None:
    row = RunRow(run_id="run_1", lane="conv:C1", conversation="C1", state="running",
                 elapsed_s=5.2, activity="Bash", quiet_s=100.4)
    done = FinishedRow(run_id="run_0", conversation="C0", ok=True, error=None,
                       duration_s=3.0, finished_at=T0 - 7.5)
    snapshot = base(runs=(row,), finished=(done,), heartbeat_age_s=4.2)
    # A third of a second later every clock shows the same whole second.
    later = base(taken_at=T0 + 0.3, heartbeat_age_s=4.5, finished=(done,),
                 runs=(attrs.evolve(row, elapsed_s=5.5, quiet_s=100.7),))
    assert shown(later) == shown(snapshot)
    # Each clock's next second is a new picture: elapsed, idle, heartbeat, "… ago".
    for moved in (
        attrs.evolve(later, runs=(attrs.evolve(later.runs[0], elapsed_s=6.0),)),
        attrs.evolve(later, runs=(attrs.evolve(later.runs[0], quiet_s=101.0),)),
        attrs.evolve(later, heartbeat_age_s=5.0),
        attrs.evolve(later, taken_at=T0 + 0.6),
    ):
        assert shown(moved) != shown(snapshot)
    assert shown(attrs.evolve(later, queued=1)) != shown(snapshot)
