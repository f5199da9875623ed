"""§6 cancellation, and runs the server no longer knows (§2 heartbeat_ack.unknown)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import trio

from tests.kit import Gate, finished, running_harness, running_server


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes: it is waiting to be reaped by its parent.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def test_cancel_of_a_queued_and_of_a_running_run(tmp_path: Path) -> None:
    gate = Gate()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(gate.serve)
            async with running_server() as server, running_harness(
                server, tmp_path, exec_command=gate.command
            ) as running:
                busy = await server.submit_run("long", conversation_id="A")
                queued = await server.submit_run("waiting", conversation_id="B")
                await gate.wait_started(busy)
                await server.wait_until(lambda s: s.runs[queued].state == "accepted")

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
                await running.harness.wait_released(busy)
                assert not running.harness.held
            nursery.cancel_scope.cancel()


async def test_heartbeat_ack_cancel_stops_a_run(tmp_path: Path) -> None:
    gate = Gate()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(gate.serve)
            async with running_server() as server, running_harness(
                server, tmp_path, exec_command=gate.command
            ):
                run_id = await server.submit_run("long")
                await gate.wait_started(run_id)
                await server.send_raw(json.dumps(
                    {"type": "heartbeat_ack", "seq": 1, "cancel": [run_id], "unknown": []}))
                await server.wait_until(finished(run_id))
                completion = server.run(run_id).completion
                assert completion is not None
                assert completion["error"] == "cancelled: cancelled by the server"
            nursery.cancel_scope.cancel()


async def test_runs_the_server_no_longer_knows_are_stopped_and_not_reported(
    tmp_path: Path,
) -> None:
    gate = Gate()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(gate.serve)
            async with running_server() as server, running_harness(
                server, tmp_path, exec_command=gate.command
            ) as running:
                busy = await server.submit_run("long", conversation_id="A")
                queued = await server.submit_run("waiting", conversation_id="A")
                await gate.wait_started(busy)
                await server.wait_until(lambda s: s.runs[queued].state == "accepted")
                pid = gate.pids[busy]
                await server.send_raw(json.dumps(
                    {"type": "heartbeat_ack", "seq": 1, "cancel": [],
                     "unknown": [busy, queued, "never-heard-of-it"]}))
                await running.harness.wait_released(busy)
                await running.harness.wait_released(queued)
                assert not alive(pid)
                assert server.run(busy).completion_posts == 0
                assert server.run(queued).completion_posts == 0
                assert queued not in gate.started
                assert running.ledger is not None
                for run_id in (busy, queued):
                    row = running.ledger.get(run_id)
                    assert row is not None and row.state == "reported"
            nursery.cancel_scope.cancel()


async def test_a_cancel_for_a_run_not_held_is_ignored(tmp_path: Path) -> None:
    gate = Gate()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(gate.serve)
            async with running_server() as server, running_harness(
                server, tmp_path, exec_command=gate.command
            ):
                await server.send_raw(json.dumps({"type": "cancel", "run_id": "nope"}))
                run_id = await server.submit_run("still works")
                await gate.wait_started(run_id)
                await gate.release(run_id, "fine")
                await server.wait_until(finished(run_id))
                assert server.run(run_id).reply == "fine"
            nursery.cancel_scope.cancel()
