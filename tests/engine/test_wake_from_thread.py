"""A thread that finishes after its trio run is over (a run that ended before the
confinement it began was made, a test whose trio run returned) must wake nobody
and print nothing: CI once printed ``RunFinishedError`` from such a thread."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import trio
import trio.lowlevel

from prohost.engine.blocking import wake_from_thread

PROHOST = Path(__file__).resolve().parents[2] / "prohost"


def test_a_thread_that_ends_after_its_trio_run_wakes_nobody_and_raises_nothing() -> None:
    release, delivered = threading.Event(), threading.Event()
    raised: list[BaseException] = []
    woken: list[str] = []

    def work() -> None:
        release.wait(timeout=30)

    async def main() -> None:
        token = trio.lowlevel.current_trio_token()

        def deliver(_result: object) -> None:
            try:
                wake_from_thread(token, lambda: woken.append("late"))
            except BaseException as exc:  # what trio's thread cache would print
                raised.append(exc)
            finally:
                delivered.set()

        trio.lowlevel.start_thread_soon(work, deliver)

    trio.run(main)  # returns while the thread still works
    release.set()
    assert delivered.wait(timeout=30)
    assert raised == [] and woken == []


async def test_a_thread_wakes_its_live_trio_run() -> None:
    token = trio.lowlevel.current_trio_token()
    woken = trio.Event()
    await trio.to_thread.run_sync(wake_from_thread, token, woken.set)
    with trio.fail_after(10):
        await woken.wait()


def test_every_wake_from_a_thread_goes_through_the_one_helper() -> None:
    # A second hand-written run_sync_soon is how the unguarded one came about.
    calls = [f"{path.relative_to(PROHOST)}:{number}"
             for path in sorted(PROHOST.rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"\.run_sync_soon\(", line)]
    assert calls == ["engine/blocking.py:" + str(_helper_line())], calls


def _helper_line() -> int:
    lines = (PROHOST / "engine" / "blocking.py").read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if "token.run_sync_soon(wake, *args)" in line)
