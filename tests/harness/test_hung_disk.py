"""A hung disk outside the ledger still lets the second signal exit in its 5 s window
(issue 16, point 4), and MCP folders left by a killed process are swept at start
(issue 16, point 7).

Each hung step really blocks a worker thread on a ``threading.Event`` that the test
only sets once the harness has exited (or at teardown). Time is trio's mock clock:
it stands still until the second signal, and from then on leaps whenever every
task waits, so each wait takes its full bound; a harness that honours the window
exits at most 5 virtual seconds after the signal. One that waits for the hung
thread would never exit: a rescuer releases the disk after 60 virtual seconds,
so such a harness fails the window's assertion instead of hanging the test.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from prohost.engine.agent.environment import scratch_folder
from prohost.engine.harness import STOP_WINDOW_S, Harness
from prohost.engine.ledger import Ledger
from prohost.engine.view import status_file
from prohost.options import Options
from prohost.server import ServerHandle
from tests.kits.fake_clis import FAKE_CLAUDE, claude_env
from tests.kits.harness import (
    Gate,
    endpoints_for,
    finished,
    pair_home,
    running_harness,
    running_server,
    wait_rescued_late,
    wall_clock_bound,
)
from tests.kits.paths import logs_folder

MCP = {"url": "https://mcp.example/mcp", "token": "mcp-token-0123"}


class HungDisk:
    """Wraps a blocking file call so that the chosen calls hang until :meth:`release`."""

    def __init__(self) -> None:
        self.released = threading.Event()
        #: Set once a call is hanging.
        self.entered = threading.Event()

    def wrap(self, real: Callable[..., Any], hangs: Callable[..., bool]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if hangs(*args, **kwargs):
                self.entered.set()
                self.released.wait()
            return real(*args, **kwargs)
        return call

    def release(self) -> None:
        self.released.set()

    async def wait_entered(self) -> None:
        await trio.to_thread.run_sync(self.entered.wait, abandon_on_cancel=True)


@pytest.fixture
def disk() -> Iterator[HungDisk]:
    hung = HungDisk()
    yield hung
    hung.release()


def under(folder: Path) -> Callable[..., bool]:
    return lambda path, *args, **kwargs: Path(path).is_relative_to(folder)


async def stop_in_its_window(
    harness: Harness, disk: HungDisk, mock_clock: trio.testing.MockClock,
    start_run: Callable[[], Any],
) -> None:
    """Run ``harness``, let ``start_run`` bring it to the hung step, then drain and
    stop it: it must exit 130 within the window."""
    codes: list[int] = []
    exited = trio.Event()
    async with trio.open_nursery() as nursery:

        async def run_it(*, task_status: Any) -> None:
            codes.append(await harness.run(task_status=task_status))
            exited.set()

        await nursery.start(run_it)
        await start_run()
        harness.drain()
        signalled = trio.current_time()
        harness.stop()
        # From now on every wait takes its whole bound (see the module docstring).
        await wait_rescued_late(nursery, mock_clock, exited, disk.release)
    assert codes == [130]
    assert trio.current_time() - signalled <= STOP_WINDOW_S + 1e-6
    mock_clock.autojump_threshold = float("inf")


async def a_hung_step_then_a_restart(
    tmp_path: Path, disk: HungDisk, mock_clock: trio.testing.MockClock,
    *, wait_for: Callable[[Gate, ServerHandle, str], Any],
    env: dict[str, str] | None = None, body: dict[str, Any] | None = None, **fields: Any,
) -> None:
    """The second signal while a run waits on the hung step; then, the disk answering
    again, the next start reports that run, once."""
    home = tmp_path / "home"
    gate = Gate()
    # Until the stop, trio's clock stands still (the module docstring says why):
    # should the hung step never be reached, the wall-clock bound ends the test.
    async with wall_clock_bound(120), trio.open_nursery() as gate_nursery:
        await gate_nursery.start(gate.serve)
        async with running_server() as server:
            creds = pair_home(server, home)
            fields = {"exec_command": gate.command, **fields}
            options = Options(home=home, machine="test", workdir=tmp_path / "work", **fields)
            run_ids: list[str] = []

            async def start_run() -> None:
                run_ids.append(await server.submit_run("long", conversation_id="A", **(body or {})))
                await wait_for(gate, server, run_ids[0])

            with Ledger.open(home / "ledger.sqlite3") as ledger:
                async with httpx.AsyncHTTPTransport() as client:
                    harness = Harness(options, endpoints_for(creds), client=client,
                                      ledger=ledger, env=env)
                    await stop_in_its_window(harness, disk, mock_clock, start_run)
            disk.release()
            async with running_harness(server, home, workdir=tmp_path / "work", env=env,
                                       **fields):
                await server.wait_until(finished(run_ids[0]))
            assert server.run(run_ids[0]).completion_posts == 1
        gate_nursery.cancel_scope.cancel()


@pytest.mark.protocol("§7", "§9")
async def test_a_hung_status_file_write(
    tmp_path: Path, disk: HungDisk, mock_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(status_file, "write_snapshot",
                        disk.wrap(status_file.write_snapshot, lambda *args: True))

    async def started(gate: Gate, server: ServerHandle, run_id: str) -> None:
        await gate.wait_started(run_id)
        await disk.wait_entered()

    await a_hung_step_then_a_restart(tmp_path, disk, mock_clock, wait_for=started)


@pytest.mark.protocol("§7", "§9")
async def test_a_hung_status_file_removal(
    tmp_path: Path, disk: HungDisk, mock_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(status_file, "_remove_quietly",
                        disk.wrap(status_file._remove_quietly, lambda *args: True))

    async def started(gate: Gate, server: ServerHandle, run_id: str) -> None:
        await gate.wait_started(run_id)

    await a_hung_step_then_a_restart(tmp_path, disk, mock_clock, wait_for=started)


@pytest.mark.protocol("§7", "§9")
async def test_a_hung_mkdir_of_the_working_folder(
    tmp_path: Path, disk: HungDisk, mock_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    workdir = tmp_path / "work"
    monkeypatch.setattr(os, "mkdir", disk.wrap(os.mkdir, lambda path, *a: Path(path) == workdir))

    async def hanging(gate: Gate, server: ServerHandle, run_id: str) -> None:
        await disk.wait_entered()

    await a_hung_step_then_a_restart(tmp_path, disk, mock_clock, wait_for=hanging)


@pytest.mark.protocol("§7", "§9")
async def test_a_hung_removal_of_the_mcp_folder(
    tmp_path: Path, disk: HungDisk, mock_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The run's agent has finished; removing its MCP folder (with the token) hangs."""
    monkeypatch.setattr(shutil, "rmtree",
                        disk.wrap(shutil.rmtree, under(tmp_path / "home" / "runs")))

    async def hanging(gate: Gate, server: ServerHandle, run_id: str) -> None:
        await disk.wait_entered()

    await a_hung_step_then_a_restart(
        tmp_path, disk, mock_clock, wait_for=hanging, exec_command=FAKE_CLAUDE,
        brain="claude", env=claude_env(tmp_path), body={"mcp": MCP})


async def test_mcp_folders_left_behind_are_swept_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 16 (7): a kill -9 leaves a run's MCP folder with its 0600 token; the
    next start removes it before any run, and never a folder of a run of its own."""
    caplog.set_level(logging.INFO, logger="prohost.harness")
    home = tmp_path / "home"
    left = scratch_folder(home / "runs", "run-killed-earlier")
    left.mkdir(parents=True, mode=0o700)
    (left / "mcp.json").write_text('{"token": "left"}')
    (left / "mcp.json").chmod(0o600)
    mine = logs_folder(tmp_path)
    # Not a run's folder: the sweep leaves it alone.
    (home / "runs" / "notes").mkdir()
    async with running_server() as server, running_harness(
        server, home, exec_command=FAKE_CLAUDE, brain="claude",
        env=claude_env(tmp_path, FAKE_CLAUDE_RECORD=str(mine / "record.json")),
    ):
        # Started and connected: no run has been spawned yet.
        assert not left.exists()
        assert "removed 1 MCP folder(s)" in caplog.text
        run_id = await server.submit_run("use the tools", conversation_id="C", mcp=MCP)
        await server.wait_until(finished(run_id))
        completion = server.run(run_id).completion
        assert completion is not None and completion["ok"] is True, completion
    # The run's own folder was there for its agent (it read its configuration).
    (record,) = json.loads((mine / "record.json").read_text())
    assert record["mcp_config_mode"] == 0o600
    assert (home / "runs" / "notes").is_dir()


@pytest.fixture(autouse=True)
def _quiet_http(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="httpx")


@pytest.mark.protocol("§9")
async def test_a_hung_disk_under_the_daily_worktree_collection_gives_up_at_the_stop(
    tmp_path: Path, disk: HungDisk, mock_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """The daily pass reads each lane folder in a worker thread; a disk that stops
    answering there must not hold the harness's exit: the second signal's deadline
    (Bounds.hurry) ends the wait, and the pass logs it and returns."""
    from prohost.engine.blocking import Bounds
    from prohost.engine.repos import collect
    from prohost.engine.supervisor import upkeep

    lane = tmp_path / "home" / "worktrees" / "lane-1"
    lane.mkdir(parents=True)
    monkeypatch.setattr(collect, "_idle_since", disk.wrap(collect._idle_since, under(lane)))
    bounds = Bounds()
    returned = trio.Event()

    async def collect_now() -> None:
        await upkeep.DailyPass(tmp_path / "home", bounds).collect_worktrees()
        returned.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(collect_now)
        await disk.wait_entered()
        signalled = trio.current_time()
        bounds.hurry(signalled + STOP_WINDOW_S)
        # A pass that waited for the disk would return only once it answers: late.
        await wait_rescued_late(nursery, mock_clock, returned, disk.release)
    assert trio.current_time() - signalled <= STOP_WINDOW_S + 1e-6
    assert "could not collect old worktrees" in caplog.text
