"""A run's checkouts are read through the harness's bounds (issue 39.4: the bounds
reach the checkouts' reader from the object made with them, not through every
function): a disk that hangs while a checkout's state is taken gives up at the
second signal's deadline, not at the reading's own limit.

Real git and a real worktree; the hung read really blocks a worker thread on a
``threading.Event`` until the test ends.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from prohost.engine.blocking import Bounds
from prohost.engine.repos import changes
from prohost.engine.repos.worktrees import WorktreeManager
from prohost.engine.run.checkouts import LaneCheckouts
from prohost.wire.runs import AgentRun
from tests.kits.repos import make_repo

pytestmark = [pytest.mark.usefixtures("isolated_git"), pytest.mark.protocol("§7", "§9")]

#: The reading's own limit here: only the hurry can end the hung read sooner.
READING_LIMIT_S = 20.0
#: The second signal's window, as the harness hurries its bounds to it (shorter here).
WINDOW_S = 0.5


@pytest.fixture
def released() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()  # the abandoned thread ends with the test


async def test_a_hung_read_of_a_run_s_checkout_gives_up_when_the_harness_is_hurried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, released: threading.Event,
) -> None:
    source = await make_repo(tmp_path / "code" / "app")
    home = tmp_path / "home"
    worktrees = WorktreeManager(home, [source])
    bounds = Bounds()  # the harness's: its second signal hurries them
    checkouts = LaneCheckouts(worktrees, bounds, env=None)
    entered = threading.Event()
    real = changes._read_all

    def hung(where: str, *args: Any) -> Any:
        if Path(where).is_relative_to(home):
            entered.set()
            released.wait()
        return real(where, *args)

    monkeypatch.setattr(changes, "_read_all", hung)
    monkeypatch.setitem(changes.CheckoutReader.state.__kwdefaults__, "limit_s",
                        READING_LIMIT_S)
    run = AgentRun(run_id="run_1", completion_path="/c", text="work", conversation_id="C1")
    with trio.fail_after(READING_LIMIT_S * 2):
        async with trio.open_nursery() as nursery:
            ready: list[bool] = []

            async def prepare() -> None:
                ready.append(await checkouts.prepare(run, trio.current_time() + 600))

            nursery.start_soon(prepare)
            await trio.to_thread.run_sync(entered.wait, abandon_on_cancel=True)
            hurried = trio.current_time()
            bounds.hurry(hurried + WINDOW_S)  # the second signal
    # The shielded read gives up at the hurry, not at its own limit.
    assert trio.current_time() - hurried < WINDOW_S + 2.0
    assert ready == [True]
    # What the ledger keeps of the run's start says why its files are not known.
    kept = checkouts.start_state()
    assert kept is not None
    assert "its files could not be read at the start" in kept
    assert "did not finish within its bound" in kept
