"""The status file catches a change made during its pause between writes.

It is rewritten at most once a second. A change during that pause used to wait for
the next notice, up to REFRESH_S (5 s) later: a harness that had just connected and
finished a run still showed "connecting" to `agent status` (exit 4), which the
README's newcomer path ran into. Real clock: the writes are in worker threads.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import trio

from prohost.engine.blocking import Bounds
from prohost.engine.changes import Changes
from prohost.engine.view.snapshot import REFRESH_S, Snapshot
from prohost.engine.view.status_file import STATUS_FILE_MIN_INTERVAL_S, keep_status_file
from tests.kits.panel import base
from tests.kits.status import status_says


def keep(nursery: trio.Nursery, take: Callable[[], Snapshot], changes: Changes,
         home: Path) -> None:
    nursery.start_soon(lambda: keep_status_file(take, changes=changes, home=home,
                                                bounds=Bounds()))


async def the_next_write_shows_it_after_the_pause(home: Path) -> None:
    """The next write says "connected", right after the pause: well before the
    REFRESH_S that a missed notice would have waited."""
    started = trio.current_time()
    await status_says(home, lambda seen: seen.connection == "connected")
    took = trio.current_time() - started
    assert took < STATUS_FILE_MIN_INTERVAL_S + (REFRESH_S - STATUS_FILE_MIN_INTERVAL_S) / 2


async def test_a_change_during_the_pause_is_written_after_it(tmp_path: Path) -> None:
    changes = Changes()
    current = [base(connection="connecting")]
    async with trio.open_nursery() as nursery:
        keep(nursery, lambda: current[0], changes, tmp_path)
        await status_says(tmp_path, lambda seen: seen.connection == "connecting")
        current[0] = base(connection="connected")
        changes.notify()  # during the pause that follows the first write
        await the_next_write_shows_it_after_the_pause(tmp_path)
        nursery.cancel_scope.cancel()


async def test_a_change_while_a_picture_is_written_is_written_after_the_pause(
    tmp_path: Path,
) -> None:
    # The notice comes while the first picture is taken, before its write ends:
    # that picture may not show it, so the next write must follow the pause.
    changes = Changes()
    taken: list[Snapshot] = []

    def take() -> Snapshot:
        if not taken:
            changes.notify()  # the state moves on while this first picture is written
        taken.append(base(connection="connected" if taken else "connecting"))
        return taken[-1]

    async with trio.open_nursery() as nursery:
        keep(nursery, take, changes, tmp_path)
        await status_says(tmp_path, lambda seen: seen.connection == "connecting")
        await the_next_write_shows_it_after_the_pause(tmp_path)
        nursery.cancel_scope.cancel()
