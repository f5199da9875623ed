"""Issue 8: one message from the server can never crash the harness (§2, §3).

Every test here runs the production harness against a real server on 127.0.0.1 and
sends what a hostile or buggy server could: the harness answers (an ack, a pong)
or drops the message with a log line, keeps its one connection, and still runs the
next good run. Each case that once crashed the harness says so.
"""

from __future__ import annotations

import functools
import gc
import json
import logging
import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio_websocket

from prohost.engine.harness import Harness
from prohost.engine.link.connection import Endpoints, Link, Session
from prohost.options import Options
from prohost.server import ServerHandle
from prohost.wire import intake
from prohost.wire.protocol import Ack, Message, Pong
from prohost.wire.signature import sign
from tests.kits.harness import (
    Running,
    ack_to,
    agent_command,
    delivery_frame,
    finished,
    gated_harness,
    messages,
    run_body,
    running_harness,
    running_server,
    start_run,
)

pytestmark = pytest.mark.protocol("§2")

DEEP = 2_000  #: levels of nesting: over what Python's JSON parser can recurse through


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


def pongs(running: Running) -> list[Any]:
    return [pong.id for pong in messages(running.server.state, Pong)]


async def ping_round_trip(running: Running, ping_id: str) -> None:
    """Send a ping and wait for its pong: every frame sent before it has been read."""
    await running.server.send_raw(json.dumps({"type": "ping", "id": ping_id}))
    await running.server.wait_until(lambda s: ping_id in pongs(running))


async def still_serving(running: Running, tag: str) -> None:
    """The same connection is up, and a good run after the hostile input still runs."""
    server = running.server
    run_id = await server.submit_run(f"after {tag}", conversation_id=f"C-{tag}")
    await server.wait_until(finished(run_id))
    assert server.run(run_id).state == "completed"
    assert server.state.total_connects == 1
    assert running.exit_code == []


@asynccontextmanager
async def replying_harness(tmp_path: Path) -> AsyncIterator[tuple[ServerHandle, Running]]:
    """A reference server, and the harness on it, whose agent replies "fine"."""
    async with running_server() as server, running_harness(
        server, tmp_path, exec_command=agent_command("reply.py", "fine")
    ) as running:
        yield server, running


# --------------------------------------------------------------------------- reproductions


@pytest.mark.parametrize("levels", [DEEP, 100_000])
async def test_reproduction_2_a_deeply_nested_frame_is_dropped(
    tmp_path: Path, levels: int, caplog: pytest.LogCaptureFixture
) -> None:
    # Once: RecursionError out of the reader, the supervisor gone, every agent killed.
    with trio.fail_after(60):
        async with replying_harness(tmp_path) as (server, running):
            await server.send_raw('{"type":"ping","id":"deep","x":' + deep(levels) + "}")
            await ping_round_trip(running, "after")
            assert "deep" not in pongs(running)
            assert "nested too deeply" in caplog.text
            await still_serving(running, "deep")


@pytest.mark.protocol("§3")
async def test_reproduction_2_a_deeply_nested_body_is_400(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with replying_harness(tmp_path) as (_, running):
            body = json.dumps(run_body("r_deep"))[:-1] + ', "x": ' + deep(DEEP) + "}"
            ack = await ack_to(running, body)
            assert (ack.status, ack.reason) == (400, "body is not JSON: nested too deeply")
            assert not running.harness.held
            await still_serving(running, "deep-body")


@pytest.mark.protocol("§3")
@pytest.mark.parametrize(
    ("field", "escape"),
    [("text", True), ("conversation_id", True), ("text", False), ("author", True)],
)
async def test_reproduction_3_a_lone_surrogate_is_400_naming_the_field(
    tmp_path: Path, field: str, escape: bool
) -> None:
    # Once: UnicodeEncodeError out of the reader (signing the body, or writing the
    # ledger). Now: refused as 400 (docs/protocol.md, "Hostile input").
    with trio.fail_after(60):
        async with replying_harness(tmp_path) as (_, running):
            body = json.dumps(run_body("r_sur", **{field: "a\ud800b"}))
            if not escape:
                # The surrogate in the body string itself, not as a JSON escape in it.
                body = body.replace("\\ud800", "\ud800")
                assert "\ud800" in body
            ack = await ack_to(running, body)
            assert ack.status == 400
            if escape:
                assert ack.reason == (
                    f"body.{field} holds a lone surrogate, which is not valid UTF-8")
            else:
                assert ack.reason.startswith("body is not valid UTF-8: a lone surrogate")
            # Refused whole: nothing reaches the ledger, so no prompt is ever built.
            assert not running.harness.held
            assert running.ledger is not None and running.ledger.get("r_sur") is None
            await still_serving(running, "surrogate")


# --------------------------------------------------------------------------- bodies: 400


@pytest.mark.protocol("§3")
@pytest.mark.parametrize(
    ("body", "reason"),
    [
        # Valid JSON, not an object.
        ("[1, 2]", "body is not a JSON object"),
        ('"just a string"', "body is not a JSON object"),
        ("null", "body is not a JSON object"),
        # Numbers Python cannot hold as it stands, and JSON's non-numbers.
        (json.dumps(run_body("r1"))[:-1] + ', "n": ' + "7" * 5000 + "}",
         "body is not JSON: a number of 5000 digits is too long"),
        (json.dumps(run_body("r1"))[:-1] + ', "n": NaN}',
         "body is not JSON: NaN is not a JSON number"),
        (json.dumps(run_body("r1"))[:-1] + ', "created_at": -Infinity}',
         "body is not JSON: -Infinity is not a JSON number"),
        (json.dumps(run_body("r1"))[:-1] + ', "created_at": 1e999}',
         "body is not JSON: the number 1e999 is out of range"),
        # Two run_ids: which one would run? Neither.
        (json.dumps(run_body("r1"))[:-1] + ', "run_id": "r2"}',
         "body is not JSON: the key 'run_id' appears twice in one object"),
        # Names that are folders (reproduction 1's way in).
        (json.dumps(run_body(".")), "body.run_id must not be '.'"),
        (json.dumps(run_body("..")), "body.run_id must not be '..'"),
        # conversation_id: a string of 1–256 UTF-8 bytes.
        (json.dumps(run_body("r1", conversation_id="")),
         "body.conversation_id must be 1–256 bytes of UTF-8 (it is 0)"),
        (json.dumps(run_body("r1", conversation_id="é" * 128 + "x")),
         "body.conversation_id must be 1–256 bytes of UTF-8 (it is 257)"),
        (json.dumps(run_body("r1", conversation_id=42)), "body.conversation_id"),
        (json.dumps(run_body("r1", context=[{"text": "ok"}, {"text": "\ud800"}])),
         "body.context[1].text holds a lone surrogate, which is not valid UTF-8"),
    ],
)
async def test_hostile_bodies_are_400_with_a_reason(
    tmp_path: Path, body: str, reason: str
) -> None:
    with trio.fail_after(60):
        async with replying_harness(tmp_path) as (server, running):
            ack = await ack_to(running, body)
            assert ack.status == 400
            assert reason in ack.reason
            assert not running.harness.held
            assert server.state.total_connects == 1


@pytest.mark.protocol("§3")
async def test_a_256_byte_conversation_id_and_an_emoji_pair_are_fine(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with replying_harness(tmp_path) as (_, running):
            # json.dumps writes the emoji as a surrogate *pair* of escapes: valid.
            body = json.dumps(run_body("r1", conversation_id="é" * 128, text="hi 😀"))
            assert "\\ud83d\\ude00" in body
            ack = await ack_to(running, body)
            assert (ack.status, ack.reason) == (200, "accepted")


# --------------------------------------------------------------------------- frames


async def test_odd_ping_ids_are_answered_and_never_crash(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with replying_harness(tmp_path) as (server, running):
            # Once: a lone surrogate in a pong made the socket's UTF-8 encoder raise.
            await server.send_raw('{"type": "ping", "id": "p\\ud800"}')
            await server.send_raw('{"type": "ping", "id": {"nested": [1, 2.5, null]}}')
            await server.send_raw('{"type": "ping", "id": ' + "9" * 5000 + "}")
            await server.send_raw('{"type": "ping", "id": NaN}')
            await ping_round_trip(running, "last")
            ids = pongs(running)
            assert ids[-5:] == ["p\ud800", {"nested": [1, 2.5, None]}, None, None, "last"]
            await still_serving(running, "pings")


@pytest.mark.protocol("§3")
async def test_odd_deliveries_are_acked_or_dropped_on_the_same_connection(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with trio.fail_after(60):
        async with replying_harness(tmp_path) as (server, running):
            secret = running.creds.secret
            now = int(time.time())
            good = json.dumps(run_body("r1"))
            frames = [
                # No string id: cannot be acked; dropped with a log line.
                '{"type": "delivery", "id": 7, "body": "{}"}',
                '{"type": "delivery", "id": ' + "1" * 5000 + ', "body": "{}"}',
                '{"type": "delivery", "id": null}',
                # A 5,000-digit timestamp is no usable integer: 401.
                json.dumps({"type": "delivery", "id": "ts", "event": "agent.run", "body": good,
                            "signature": sign(secret, now, good)})[:-1]
                + ', "timestamp": ' + "1" * 5000 + "}",
                # A 400-digit one is an integer, far from now: 401, not OverflowError.
                json.dumps({"type": "delivery", "id": "ts2", "event": "agent.run",
                            "body": good, "timestamp": int("9" * 400), "signature": "v1=0"}),
                # A signature that is not ASCII: 401, not UnicodeEncodeError.
                json.dumps({"type": "delivery", "id": "sig", "event": "agent.run", "body": good,
                            "timestamp": now, "signature": "v1=\ud800é"}),
                # A body that is no string and cannot be written back as JSON: 401.
                '{"type": "delivery", "id": "nb", "timestamp": ' + str(now)
                + ', "signature": "v1=00", "body": [NaN]}',
                # An id holding a lone surrogate is acked with that very id.
                json.dumps({"type": "delivery", "id": "d\ud800", "event": "agent.run",
                            "body": good, "timestamp": now, "signature": "v1=00"}),
                # An odd event, signed: 204, its name shown safely.
                delivery_frame(secret, good, delivery_id="ev", event="x\ud800" * 100),
                # Duplicate keys in a frame: the last one wins (as in every JSON parser).
                '{"type": "delivery", "id": "first", "id": "dup", "body": 5}',
            ]
            for frame in frames:
                await server.send_raw(frame)
            await ping_round_trip(running, "done")
            got = {ack.id: (ack.status, ack.reason) for ack in messages(server.state, Ack)}
            assert got["ts"] == (401, "timestamp missing or not an integer")
            assert got["ts2"][0] == 401 and "ages" in got["ts2"][1]
            assert got["sig"] == (401, "signature does not match")
            assert got["nb"] == (401, "signature does not match (body is not a string)")
            assert got["d\ud800"] == (401, "signature does not match")
            assert got["ev"][0] == 204 and "'x\\ud800x" in got["ev"][1]
            assert got["dup"][0] == 401 and "first" not in got
            assert len(got) == 7 == len(messages(server.state, Ack))
            assert caplog.text.count("dropped a malformed message") >= 3
            await still_serving(running, "deliveries")


@pytest.mark.protocol("§6")
async def test_a_cancel_reason_with_a_lone_surrogate_is_reported_safely(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        async with gated_harness(tmp_path) as (gate, running):
            server = running.server
            run_id = await start_run(server, gate, "long one")
            await server.send_raw(json.dumps({"type": "cancel", "run_id": run_id,
                                              "reason": "stop \ud800 now"}))
            await server.wait_until(finished(run_id))
            assert server.run(run_id).error == "cancelled: stop ? now"
            assert server.state.total_connects == 1


async def test_a_bug_handling_one_message_is_logged_and_the_reader_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*args: Any, **kwargs: Any) -> intake.Verdict:
        raise KeyError("a bug in classify")

    with trio.fail_after(60):
        async with replying_harness(tmp_path) as (server, running):
            monkeypatch.setattr(intake, "classify", broken)
            await server.send_raw(
                delivery_frame(running.creds.secret, run_body("r1"), delivery_id="d1"))
            await ping_round_trip(running, "after the bug")
            record = next(r for r in caplog.records if "could not be handled" in r.getMessage())
            assert record.levelno == logging.ERROR and record.exc_info is not None
            assert "a bug in classify" in caplog.text
            monkeypatch.undo()
            await still_serving(running, "bug")


# --------------------------------------------------------------------------- queue cap


@pytest.mark.protocol("§3")
async def test_a_full_queue_refuses_new_runs_with_503_but_not_redeliveries(
    tmp_path: Path,
) -> None:
    assert intake.MAX_QUEUED_RUNS == 10_000
    assert Options(home=tmp_path).max_queued == 10_000
    # The same rule with a cap of 2 (--max-queued 2), so that the test need not
    # queue 10,000 runs.
    with trio.fail_after(60):
        async with gated_harness(tmp_path, max_queued=2) as (gate, running):
            server = running.server
            await start_run(server, gate, "takes the only slot")

            async def deliver(run_id: str, delivery_id: str) -> tuple[int, str]:
                ack = await ack_to(running, run_body(run_id), delivery_id)
                return ack.status, ack.reason

            assert await deliver("q1", "d1") == (200, "accepted")
            assert await deliver("q2", "d2") == (200, "accepted")
            assert running.harness.scheduler.statistics().queued == 2
            assert await deliver("q3", "d3") == (503, "queue full")
            assert "q3" not in running.harness.held
            # A run already held is still 200: the server must stop redelivering it.
            assert await deliver("q1", "d4") == (200, "already accepted")
            assert server.state.total_connects == 1


# --------------------------------------------------------------------------- status first


@pytest.mark.protocol("§1")
async def test_status_is_the_first_message_even_when_a_ping_and_a_refusal_follow_hello(
    tmp_path: Path,
) -> None:
    received: list[dict[str, Any]] = []
    done = trio.Event()

    async def handler(request: trio_websocket.WebSocketRequest) -> None:
        ws = await request.accept()
        # All three at once, before the harness has sent anything.
        await ws.send_message(json.dumps({"type": "hello", "heartbeat_s": 60}))
        await ws.send_message(json.dumps({"type": "ping", "id": "p1"}))
        await ws.send_message(json.dumps({"type": "delivery", "id": "d1",
                                          "event": "agent.run", "body": "{}"}))
        while len(received) < 4:
            received.append(json.loads(await ws.get_message()))
        done.set()
        await trio.sleep_forever()

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(trio_websocket.serve_websocket, handler,
                                         "127.0.0.1", 0, None)
            port = server.port
            options = Options(home=tmp_path, machine="test", exec_command="true",
                              dry_run=True)
            endpoints = Endpoints(ws_url=f"ws://127.0.0.1:{port}/v1/agent/ws",
                                  api_base=f"http://127.0.0.1:{port}", token="t", secret="s")
            async with httpx.AsyncHTTPTransport() as client, trio.open_nursery() as inner:
                harness = Harness(options, endpoints, client=client, ledger=None)
                inner.start_soon(harness.run)
                await done.wait()
                inner.cancel_scope.cancel()
            nursery.cancel_scope.cancel()
    assert [m["type"] for m in received] == ["status", "heartbeat", "pong", "ack"]
    assert received[3]["status"] == 401


# --------------------------------------------------------------------------- TLS


class _Handler:
    async def on_session(
        self, session: Session, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()

    async def on_message(self, session: Session, message: Message) -> None:
        pass


class _TopOfRange(random.Random):
    """Backoff at its ceiling (0.5 s first): the retry never races the first close."""

    def uniform(self, a: float, b: float) -> float:
        return b


@pytest.mark.protocol("§1")
async def test_a_failed_tls_handshake_closes_its_tcp_stream() -> None:
    events: list[str] = []
    changed = trio.Event()

    async def answer_garbage(stream: trio.SocketStream) -> None:
        nonlocal changed
        number = sum(e.startswith("connect") for e in events) + 1
        events.append(f"connect {number}")
        try:
            await stream.send_all(b"HTTP/1.1 400 Not TLS at all\r\n\r\n" * 4)
            while await stream.receive_some():
                pass
            events.append(f"closed {number}")
        except trio.BrokenResourceError:  # a reset is a close too
            events.append(f"closed {number}")
        changed.set()
        changed = trio.Event()

    # Without the explicit close, only the cycle collector would close the socket:
    # switched off here, so the test sees what the code does, not what gc does.
    gc.disable()
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                listeners = await nursery.start(
                    functools.partial(trio.serve_tcp, answer_garbage, 0, host="127.0.0.1"))
                port = listeners[0].socket.getsockname()[1]

                def link_changed() -> None:
                    nonlocal changed
                    changed.set()
                    changed = trio.Event()

                link = Link(f"wss://127.0.0.1:{port}/v1/agent/ws", [], _Handler(),
                            rng=_TopOfRange(), on_change=link_changed)
                nursery.start_soon(link.run)
                while "closed 1" not in events or not link.statistics().attempts_failed:
                    await changed.wait()
                nursery.cancel_scope.cancel()
    finally:
        gc.enable()
    # The harness closed the first connection itself, before it dialled again
    # after its 0.5 s backoff.
    assert events[:2] == ["connect 1", "closed 1"]
    assert "SSL" in (link.statistics().last_error or "")
