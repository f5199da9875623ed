"""§6 cancellation, and runs the server no longer knows (§2 heartbeat_ack.unknown)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
import trio.testing

from prohost.wire.protocol import Pong
from tests.kits.harness import (
    Gate,
    busy_and_queued,
    finished,
    gated_harness,
    messages,
    released,
    run_state,
    running_harness,
    running_server,
    start_run,
)
from tests.kits.process import alive

pytestmark = pytest.mark.protocol("§6")


async def test_cancel_of_a_queued_and_of_a_running_run(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with gated_harness(tmp_path) as (gate, running):
            server = running.server
            busy, [queued] = await busy_and_queued(server, gate, "B")

            await server.cancel_run(queued, "changed my mind")
            await server.wait_until(finished(queued))
            assert server.run(queued).completion == {
                "run_id": queued, "ok": False, "error": "cancelled: changed my mind",
                "retryable": False}

            pid = gate.pids[busy]
            await server.cancel_run(busy)
            await server.wait_until(finished(busy))
            completion = server.run(busy).completion
            assert completion is not None
            assert completion["error"] == "cancelled: cancelled by the server"
            assert completion["retryable"] is False
            assert not alive(pid)
            assert queued not in gate.started
            await released(running.harness, busy)
            assert not running.harness.held


async def test_heartbeat_ack_cancel_stops_a_run(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with gated_harness(tmp_path) as (gate, running):
            server = running.server
            run_id = await start_run(server, gate, "long")
            await server.send_raw(json.dumps(
                {"type": "heartbeat_ack", "seq": 1, "cancel": [run_id], "unknown": []}))
            await server.wait_until(finished(run_id))
            completion = server.run(run_id).completion
            assert completion is not None
            assert completion["error"] == "cancelled: cancelled by the server"


@pytest.mark.protocol("§2")
async def test_runs_the_server_no_longer_knows_are_stopped_and_not_reported(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        async with gated_harness(tmp_path) as (gate, running):
            server = running.server
            busy, [queued] = await busy_and_queued(server, gate, "A")
            pid = gate.pids[busy]
            await server.send_raw(json.dumps(
                {"type": "heartbeat_ack", "seq": 1, "cancel": [],
                 "unknown": [busy, queued, "never-heard-of-it"]}))
            await released(running.harness, busy)
            await released(running.harness, queued)
            assert not alive(pid)
            assert server.run(busy).completion_posts == 0
            assert server.run(queued).completion_posts == 0
            assert queued not in gate.started
            assert running.ledger is not None
            for run_id in (busy, queued):
                row = running.ledger.get(run_id)
                assert row is not None and row.state == "reported"


async def test_a_cancel_for_a_run_not_held_is_ignored(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with gated_harness(tmp_path) as (gate, running):
            server = running.server
            run_id = await start_run(server, gate, "still works")
            pid = gate.pids[run_id]
            await server.send_raw(json.dumps({"type": "cancel", "run_id": "nope"}))
            # The reader takes frames in order: once the ping after it is answered,
            # the cancel has been handled.
            await server.send_raw(json.dumps({"type": "ping", "id": "after-cancel"}))
            await server.wait_until(
                lambda s: any(p.id == "after-cancel" for p in messages(s, Pong)))
            assert alive(pid)  # not signalled
            assert running.harness.held  # and still held
            await gate.release(run_id, "fine")
            await server.wait_until(finished(run_id))
            completion = server.run(run_id).completion
            assert completion is not None
            assert (completion["ok"], completion["reply"]) == (True, "fine")
            assert gate.started == [run_id]


async def test_a_queued_run_s_cancel_is_kept_before_its_turn_to_be_reported(
    tmp_path: Path,
) -> None:
    """A run cancelled while queued behind a running turn of its conversation waits
    for that turn to be reported (§4); its cancel is in the ledger at once, so a
    harness that ends meanwhile (a kill, a crash) and starts again reports it
    cancelled and never runs it (§6: a cancel is final)."""
    gate = Gate()
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(gate.serve)
            async with running_server() as server:
                async with running_harness(server, home, exec_command=gate.command) as first:
                    busy, [queued] = await busy_and_queued(server, gate, "A")
                    await server.cancel_run(queued, "not needed")
                    await trio.testing.wait_all_tasks_blocked()
                    assert first.harness.held[queued].state == "reporting"
                    assert run_state(server, queued) != "failed"  # its turn has not come
                # The first harness has ended, its agent killed: a new one takes over.
                async with running_harness(server, home, exec_command=gate.command):
                    await server.wait_until(finished(queued, busy))
            nursery.cancel_scope.cancel()
    completion = server.run(queued).completion
    assert completion is not None and completion["error"] == "cancelled: not needed"
    assert queued not in gate.started
