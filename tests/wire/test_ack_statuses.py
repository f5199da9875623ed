"""Every ack status of docs/protocol.md §3, as the server sees it over the real socket."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from prohost.wire.protocol import Pong
from tests.kits.harness import (
    Running,
    ack_to,
    agent_command,
    delivery_frame,
    finished,
    gated_harness,
    released,
    run_body,
    running_harness,
    running_server,
    start_run,
    wait_for_ack,
)

pytestmark = pytest.mark.protocol("§3")


async def status_of(
    running: Running, body: Any, delivery_id: str = "d1", **frame_options: Any
) -> tuple[int, str]:
    """The status and reason of the harness's ack to ``body``, delivered (:func:`ack_to`)."""
    ack = await ack_to(running, body, delivery_id, **frame_options)
    return ack.status, ack.reason


def frame(running: Running, body: Any, delivery_id: str, **kwargs: Any) -> str:
    return delivery_frame(running.creds.secret, body, delivery_id=delivery_id, **kwargs)


@pytest.fixture
def reply_agent() -> str:
    return agent_command("reply.py", "ok")


async def test_200_then_204_for_the_same_run(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with gated_harness(tmp_path) as (gate, running):
            server = running.server
            run_id = await start_run(server, gate, "hi", conversation_id="C1")
            body = server.run(run_id).body_text
            # Redelivered while it runs: 200 again, never a second execution.
            assert await status_of(running, body, "again") == (200, "already accepted")
            await gate.release(run_id, "answer")
            await released(running.harness, run_id)
            # Redelivered after its report settled: 204.
            assert await status_of(running, body, "late") == (204, "already reported")
            assert gate.started == [run_id]
            assert server.run(run_id).completion_posts == 1


async def test_204_for_an_event_other_than_agent_run(tmp_path: Path, reply_agent: str) -> None:
    with trio.fail_after(30):
        async with running_server() as server, running_harness(
            server, tmp_path, exec_command=reply_agent
        ) as running:
            status, _ = await status_of(running, run_body("r1"), event="agent.ping")
            assert status == 204
            assert not running.harness.held


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("{not json", "not JSON"),
        ('["a list"]', "not a JSON object"),
        (json.dumps({"completion_path": "/v1/x", "text": ""}), "run_id"),
        (json.dumps({"run_id": "r1", "text": ""}), "completion_path"),
        (json.dumps({"run_id": "r1", "completion_path": "/v1/x"}), "text"),
        (json.dumps({"run_id": 7, "completion_path": "/v1/x", "text": ""}), "run_id"),
        (json.dumps({"run_id": "r 1", "completion_path": "/v1/x", "text": ""}), "run_id"),
        (json.dumps({"run_id": "r1", "completion_path": "https://evil.example/x",
                     "text": ""}), "completion_path"),
        (json.dumps({"run_id": "r1", "completion_path": "//evil.example/x",
                     "text": ""}), "completion_path"),
        (json.dumps({"run_id": "r1", "completion_path": "/v1/%2E%2E/x", "text": ""}),
         "completion_path"),
        (json.dumps({"run_id": "r1", "completion_path": "/v1\\x", "text": ""}),
         "completion_path"),
        (json.dumps({"run_id": "r1", "completion_path": "/v1/x", "text": 5}), "text"),
        (json.dumps({"run_id": "r1", "completion_path": "/v1/x", "text": "",
                     "timeline_path": "/a/../b"}), "timeline_path"),
    ],
)
async def test_400_names_the_field(tmp_path: Path, reply_agent: str, body: str,
                                   field: str) -> None:
    with trio.fail_after(30):
        async with running_server() as server, running_harness(
            server, tmp_path, exec_command=reply_agent
        ) as running:
            status, reason = await status_of(running, body)
            assert status == 400
            assert field in reason
            assert not running.harness.held


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"signature": None}, "signature missing"),
        ({"signature": "v1=" + "0" * 64}, "does not match"),
        ({"timestamp": int(time.time()) - 301}, "clock"),
        ({"timestamp": "soon"}, "timestamp"),
    ],
)
async def test_401_for_a_bad_signature(tmp_path: Path, reply_agent: str,
                                       kwargs: dict[str, Any], words: str) -> None:
    with trio.fail_after(30):
        async with running_server() as server, running_harness(
            server, tmp_path, exec_command=reply_agent
        ) as running:
            status, reason = await status_of(running, run_body("r1"), **kwargs)
            assert status == 401
            assert words in reason
            assert not running.harness.held


async def test_allow_unverified_accepts_a_bad_signature(tmp_path: Path, reply_agent: str,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    with trio.fail_after(30):
        async with running_server() as server, running_harness(
            server, tmp_path, exec_command=reply_agent, allow_unverified=True
        ) as running:
            status, _ = await status_of(running, run_body("r1"), signature="v1=00")
            assert status == 200
            assert "without a valid signature" in caplog.text


async def test_413_beats_every_other_fault(tmp_path: Path, reply_agent: str) -> None:
    with trio.fail_after(30):
        async with running_server() as server, running_harness(
            server, tmp_path, exec_command=reply_agent
        ) as running:
            huge = json.dumps(run_body("r1", text="x" * (1024 * 1024)))
            # Unsigned and over 1 MiB: the size is what the ack names.
            status, _ = await status_of(running, huge, signature=None)
            assert status == 413
            # Exactly 1 MiB is not "over".
            padding = 1024 * 1024 - len(json.dumps(run_body("r2", text="")))
            exact = json.dumps(run_body("r2", text="y" * padding))
            assert len(exact.encode()) == 1024 * 1024
            status, _ = await status_of(running, exact, "d2")
            assert status == 200


@pytest.mark.protocol("§9")
async def test_503_while_draining(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with gated_harness(tmp_path) as (gate, running):
            server = running.server
            busy = await start_run(server, gate, "keep the harness up while it drains")
            running.harness.drain()
            status, reason = await status_of(running, run_body("r_new"))
            assert status == 503
            assert "shutting down" in reason
            # §3's order: a bad signature (401) and a bad body (400) outrank the
            # drain's 503, and the ledger's answer for the running run outranks it too.
            status, _ = await status_of(running, run_body("r_unsigned"), "d2", signature=None)
            assert status == 401
            status, _ = await status_of(running, "{not json", "d3")
            assert status == 400
            assert await status_of(running, server.run(busy).body_text, "d4") == (
                200, "already accepted")
            assert not {"r_new", "r_unsigned"} & running.harness.held.keys()
            await gate.release(busy)
            await server.wait_until(finished(busy))


@pytest.mark.protocol("§2")
async def test_ping_is_answered_with_its_id_at_once(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with gated_harness(tmp_path) as (gate, running):
            server = running.server
            # A run in flight: a pong must not wait for work.
            run_id = await start_run(server, gate, "busy", conversation_id="C1")
            await server.send_raw(json.dumps({"type": "ping", "id": "p-81"}))
            await server.send_raw(frame(running, run_body("r2"), "d2", event="agent.other"))
            await wait_for_ack(server, "d2")
            # Answered in order: the pong, with the ping's id, before the ack of the
            # frame sent right after the ping, and while the run still holds.
            after_ping = [m.message for m in server.state.received
                          if isinstance(m.message, Pong) or getattr(m.message, "id", "") == "d2"]
            assert after_ping[0] == Pong(id="p-81")
            assert [type(m).__name__ for m in after_ping] == ["Pong", "Ack"]
            assert gate.running == 1
            await gate.release(run_id)
            await server.wait_until(finished(run_id))


@pytest.mark.protocol("§2")
async def test_unknown_types_fields_and_garbage_are_ignored(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running_server() as server, running_harness(
            server, tmp_path, exec_command=agent_command("reply.py", "still here")
        ) as running:
            for junk in ["not json", "[]", '{"type": 5}', '{"no": "type"}',
                         '{"type": "weather", "sunny": true}',
                         '{"type": "delivery"}', '{"type": "cancel"}',
                         '{"type": "heartbeat_ack", "cancel": "r1"}']:
                await server.send_raw(junk)
            body = run_body("r_after", shiny_new_field={"x": 1})
            await server.send_raw(frame(running, body, "d1") [:-1] + ', "extra": 1}')
            ack = await wait_for_ack(server, "d1")
            assert ack.status == 200
            connects = server.state.total_connects
            assert connects == 1  # nothing above cost the connection
