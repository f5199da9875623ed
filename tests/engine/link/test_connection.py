"""The link's promises (§1–§2): reconnects, liveness, credentials, oversize frames."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio_websocket

from prohost.engine.link.connection import BACKOFF_CAP_S, Link, Session, backoff_delay
from prohost.server import ServerHandle
from prohost.wire import protocol
from prohost.wire.protocol import MAX_MESSAGE_BYTES, Heartbeat, Hello, Message, Pong, Status
from tests.kits.harness import finished, gated_harness, running_harness, running_server, start_run


@pytest.mark.protocol("§1")
def test_backoff_is_full_jitter_capped_at_30_s() -> None:
    rng = random.Random(7)
    for attempt in range(12):
        ceiling = min(BACKOFF_CAP_S, 0.5 * 2**attempt)
        delays = [backoff_delay(attempt, rng) for _ in range(200)]
        assert all(0 <= delay <= ceiling for delay in delays)
        # Full jitter: the whole range is used, not just the top of it.
        assert min(delays) < ceiling * 0.1 and max(delays) > ceiling * 0.9
    assert backoff_delay(10_000, rng) <= BACKOFF_CAP_S


@pytest.mark.protocol("§1")
async def test_a_dropped_socket_loses_nothing(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with gated_harness(tmp_path) as (gate, running):
            server = running.server
            run_id = await start_run(server, gate, "long", conversation_id="C1")
            await server.drop_connections()
            # The run goes on while the harness dials again.
            await server.wait_until(lambda s: s.total_connects == 2 and s.connected == 1)
            await gate.release(run_id, "made it")
            await server.wait_until(finished(run_id))
            assert server.run(run_id).reply == "made it"
            assert gate.started == [run_id]
            # On the new connection, status comes first, then a heartbeat.
            second = [entry.message for entry in server.state.received
                      if entry.connection_id != server.state.received[0].connection_id]
            assert isinstance(second[0], Status) and isinstance(second[1], Heartbeat)


@asynccontextmanager
async def dry_harness(tmp_path: Path, **server_config: Any) -> AsyncIterator[ServerHandle]:
    """A reference server and a connected harness on it in dry-run mode: no ledger, so
    no worker threads, whose real time would make the autojump clock leap ahead."""
    async with running_server(**server_config) as server, running_harness(
        server, tmp_path, exec_command="true", dry_run=True
    ):
        yield server


@pytest.mark.protocol("§2")
async def test_a_silent_server_is_left_after_three_heartbeats(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(300):
        async with dry_harness(tmp_path, heartbeat_s=5) as server:
            await server.wait_until(
                lambda s: any(isinstance(m.message, Heartbeat) for m in s.received))
            server.state.silent = True
            went_quiet = trio.current_time()
            await server.wait_until(lambda s: s.total_connects == 2)
            waited = trio.current_time() - went_quiet
            # Three periods of silence, then at most the first backoff (0.5 s).
            assert 15 <= waited <= 15 + 0.5 + 0.1


@pytest.mark.protocol("§2")
async def test_heartbeats_keep_coming_every_period(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(300):
        async with dry_harness(tmp_path, heartbeat_s=7) as server:
            await server.wait_until(lambda s: sum(
                isinstance(m.message, Heartbeat) for m in s.received) >= 4)
            beats = [m for m in server.state.received if isinstance(m.message, Heartbeat)]
            assert [b.message.seq for b in beats] == [1, 2, 3, 4]
            assert all(b.message.runs == [] for b in beats)
            gaps = [later.at - earlier.at for earlier, later in itertools.pairwise(beats[1:])]
            assert all(abs(gap - 7) < 0.5 for gap in gaps)


@pytest.mark.protocol("§1")
@pytest.mark.parametrize("status", [401, 403])
async def test_rejected_credentials_end_the_harness(
    tmp_path: Path, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    with trio.fail_after(30):
        async with running_server() as server:
            server.state.handshake_status = status
            async with running_harness(
                server, tmp_path, exec_command="true", connected=False
            ) as running:
                assert await running.wait_exit() == 1
            assert "prohost agent pair" in caplog.text
            assert sum("rejected" in r.getMessage() for r in caplog.records
                       if r.levelno >= logging.ERROR) == 1


@pytest.mark.protocol("§1")
async def test_other_handshake_failures_are_retried(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(300):
        async with running_server() as server:
            server.state.handshake_status = 503
            async with running_harness(
                server, tmp_path, exec_command="true", connected=False, dry_run=True
            ) as running:
                began = trio.current_time()
                await running.harness.wait_until(lambda h: h.link.statistics().attempts_failed >= 5)
                # Backed off (not spinning), but within the ceilings 0.5 + 1 + 2 + 4 s.
                assert 0 < trio.current_time() - began <= 7.5
                server.state.handshake_status = None
                await server.wait_until(lambda s: s.connected == 1)
                assert running.exit_code == []


class Bystander:
    """A LinkHandler that does nothing: these tests watch the socket, not the harness."""

    async def on_session(
        self, session: Session, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()
        await trio.sleep_forever()

    async def on_message(self, session: Session, message: Message) -> None:
        pass


async def close_code_for(text: str) -> int | None:
    """The close code the real Link sends a WebSocket peer that sends it ``text``.

    The peer is trio-websocket on 127.0.0.1, not the reference server: hypercorn
    hands an ASGI app 1006 or 1000 for a client's close, never the client's code.
    """
    codes, received = trio.open_memory_channel[int | None](1)

    async def peer(request: trio_websocket.WebSocketRequest) -> None:
        ws = await request.accept()
        await ws.send_message(protocol.encode(Hello(heartbeat_s=30, features=[])))
        with contextlib.suppress(trio_websocket.ConnectionClosed):
            await ws.send_message(text)
            while True:
                await ws.get_message()
        await codes.send(ws.closed.code if ws.closed else None)

    async with trio.open_nursery() as nursery:
        server = await nursery.start(partial(
            trio_websocket.serve_websocket, peer, "127.0.0.1", 0, None,
            handler_nursery=nursery))
        link = Link(f"ws://127.0.0.1:{server.port}/v1/agent/ws", [], Bystander())
        await nursery.start(link.run)
        code = await received.receive()
        nursery.cancel_scope.cancel()
    return code


@pytest.mark.protocol("§2")
async def test_a_message_over_4_mib_of_utf8_is_closed_with_1009() -> None:
    # Over 4 MiB as UTF-8 (two bytes a character), under 4 Mi characters: the whole
    # message arrives, and the link, counting bytes, closes with 1009.
    too_big = json.dumps({"type": "ping", "id": "é" * (2 * 1024 * 1024)}, ensure_ascii=False)
    assert len(too_big) < MAX_MESSAGE_BYTES < len(too_big.encode())
    with trio.fail_after(60):
        assert await close_code_for(too_big) == 1009  # "message too big", RFC 6455 §7.4.1


@pytest.mark.protocol("§2")
async def test_a_message_over_4_mi_characters_is_closed_with_1009() -> None:
    with trio.fail_after(60):
        text = json.dumps({"type": "ping", "id": "x" * MAX_MESSAGE_BYTES})
        assert await close_code_for(text) == 1009


@pytest.mark.protocol("§1", "§2")
async def test_after_a_message_over_4_mib_the_harness_reconnects(tmp_path: Path) -> None:
    too_big = json.dumps({"type": "ping", "id": "é" * (2 * 1024 * 1024)}, ensure_ascii=False)
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path, exec_command="true"
        ):
            await server.send_raw(too_big)
            await server.wait_until(lambda s: s.total_connects == 2 and s.connected == 1)
            # It let go of the message, not of the server: it answers a ping on the
            # new connection, and never answered the oversized one.
            await server.send_raw(json.dumps({"type": "ping", "id": "after"}))
            await server.wait_until(lambda s: any(
                isinstance(m.message, Pong) and m.message.id == "after" for m in s.received))
            assert [m.message.id for m in server.state.received
                    if isinstance(m.message, Pong)] == ["after"]
