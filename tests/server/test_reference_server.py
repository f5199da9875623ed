"""The reference server (prohost.server) from the harness's side of the wire.

Real hypercorn on 127.0.0.1 port 0, a real trio-websocket client playing the
harness, httpx for the HTTP API. Where a timer must pass (pings, redelivery) the
test runs under ``autojump_clock`` and asserts only what arrives and in which
order; the exact instants are asserted on the server's model with a clock set by
hand, in tests/server/test_delivery_window.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio_websocket
from trio_websocket import WebSocketConnection, open_websocket_url

from prohost.commands.send import api_base, send_command
from prohost.server import ServerConfig, ServerHandle, ServerState, serve
from prohost.server.apitoken import new_token, write_token
from prohost.wire.protocol import Ack, Heartbeat, Pong, Status
from prohost.wire.signature import check
from tests.kits.fake_harness import ack, auth, complete, harness, next_of, send
from tests.kits.harness import api_headers, running_server

pytestmark = pytest.mark.protocol("§11")

#: Server settings for tests that watch redelivery: a delivery not acked within
#: 10 s is sent again, and pings (every 100 s) stay out of the way.
REDELIVERING: dict[str, Any] = {"heartbeat_s": 100, "redeliver_after_s": 10}


async def beat(ws: WebSocketConnection, seq: int, *run_ids: str) -> dict[str, Any]:
    runs = [{"run_id": r, "state": "running", "lane": f"run:{r}"} for r in run_ids]
    await send(ws, type="heartbeat", seq=seq, runs=runs)
    return await next_of(ws, "heartbeat_ack")


async def no_more_deliveries(ws: WebSocketConnection, what: str) -> None:
    """Fail if a delivery arrives within a minute. Under ``autojump_clock`` that minute
    passes as soon as every task waits; with REDELIVERING it is six redelivery periods."""
    with trio.move_on_after(60):
        extra = await next_of(ws, "delivery")
        raise AssertionError(f"{what}: {extra}")


def failure(run_id: str, error: str) -> dict[str, Any]:
    """A completion payload for a run that failed for good."""
    return {"run_id": run_id, "ok": False, "error": error, "retryable": False}


@asynccontextmanager
async def one_harness(
    **config: Any,
) -> AsyncIterator[tuple[ServerHandle, dict[str, str], WebSocketConnection]]:
    """A reference server with one fake harness ("m1") paired and connected to it."""
    async with running_server(**config) as server:
        creds = server.pair("m1")
        async with harness(creds) as ws:
            yield server, creds, ws


def body_of(delivery: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(delivery["body"])
    return body


# ---------------------------------------------------------------------- pairing and handshake


@pytest.mark.protocol("§10")
async def test_pairing_with_the_right_and_a_wrong_code() -> None:
    with trio.fail_after(10):
        async with (
            running_server(pairing_code="ABCD-1234") as server,
            httpx.AsyncClient(base_url=server.http_url, headers=api_headers(server)) as client,
        ):
            good = await client.post(
                "/v1/agent/pair", json={"code": "abcd-1234", "machine": "studio"}
            )
            again = await client.post(
                "/v1/agent/pair", json={"code": "ABCD-1234", "machine": "laptop"}
            )
            wrong = await client.post(
                "/v1/agent/pair", json={"code": "WXYZ-0000", "machine": "studio"}
            )
            missing = await client.post("/v1/agent/pair", json={"machine": "studio"})
            garbage = await client.post("/v1/agent/pair", content=b"{nope")
    assert good.status_code == 200
    creds = good.json()
    assert set(creds) == {"token", "secret", "ws_url", "api_url", "account"}
    assert creds["ws_url"] == server.ws_url
    assert creds["api_url"] == server.http_url
    # A code works once (issue 31 point 4): the next machine needs the next code.
    assert again.status_code == 403
    assert "used already" in again.json()["error"]
    assert server.pairing_code != "ABCD-1234"
    assert wrong.status_code == 403
    assert "wrong pairing code" in wrong.json()["error"]
    assert missing.status_code == 400
    assert "code" in missing.json()["error"]
    assert garbage.status_code == 400
    assert [h.machine for h in server.state.harnesses.values()] == ["studio"]


@pytest.mark.protocol("§10")
def test_generated_pairing_code_has_the_documented_shape() -> None:
    from prohost.server.state import generate_pairing_code

    code = generate_pairing_code()
    letters, dash, digits = code[:4], code[4], code[5:]
    assert letters.isalpha() and letters.isupper() and dash == "-" and digits.isdigit()
    assert len(code) == 9


@pytest.mark.protocol("§1")
@pytest.mark.parametrize("token", [None, "not-a-paired-token"])
async def test_upgrade_without_a_paired_token_is_refused_with_401(token: str | None) -> None:
    with trio.fail_after(10):
        async with running_server() as server:
            headers = [] if token is None else [(b"Authorization", f"Bearer {token}".encode())]
            with pytest.raises(trio_websocket.ConnectionRejected) as caught:
                async with open_websocket_url(server.ws_url, extra_headers=headers):
                    pass
    assert caught.value.status_code == 401
    assert server.state.total_connects == 0


@pytest.mark.protocol("§1")
@pytest.mark.parametrize("status", [403, 503])
async def test_handshake_status_knob_refuses_with_that_exact_status(status: int) -> None:
    with trio.fail_after(10):
        async with running_server() as server:
            creds = server.pair("m1")
            server.state.handshake_status = status
            with pytest.raises(trio_websocket.ConnectionRejected) as caught:
                async with harness(creds):
                    pass
            assert caught.value.status_code == status
            server.state.handshake_status = None
            async with harness(creds):
                await server.wait_until(lambda s: s.connected == 1)


@pytest.mark.protocol("§2")
async def test_hello_comes_first_then_a_ping_every_heartbeat(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(120):
        async with running_server(heartbeat_s=7) as server:
            creds = server.pair("m1")
            async with open_websocket_url(
                creds["ws_url"], extra_headers=auth(creds, "studio")
            ) as ws:
                hello = json.loads(await ws.get_message())
                assert hello["type"] == "hello"
                assert hello["heartbeat_s"] == 7
                assert hello["features"] == ["cancel", "timeline"]
                assert abs(hello["server_time"] - time.time()) < 60
                for n in (1, 2, 3):
                    ping = json.loads(await ws.get_message())
                    assert ping == {"type": "ping", "id": f"p-{n}"}
                    await send(ws, type="pong", id=ping["id"])
                await server.wait_until(lambda s: len(s.messages(Pong)) == 3)
            conn_events = server.state.connection_events
            assert conn_events[0].machine == "studio"


async def test_silent_server_sends_nothing_but_keeps_reading(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(120):
        async with one_harness(heartbeat_s=5) as (server, _creds, ws):
            server.state.silent = True
            await send(ws, type="heartbeat", seq=1, runs=[])
            await server.wait_until(lambda s: len(s.messages(Heartbeat)) == 1)
            with trio.move_on_after(30) as quiet:
                await ws.get_message()
            assert quiet.cancelled_caught
            # The server did ping meanwhile (and answered the heartbeat), and
            # wrote none of it: silence, not idleness.
            (conn,) = server.state.connections.values()
            assert conn.pings_sent >= 2
            written = [json.loads(sent.text)["type"] for sent in server.state.sent]
            assert written == ["hello"]
            server.state.silent = False
            assert json.loads(await ws.get_message())["type"] == "ping"


# ---------------------------------------------------------------------- deliveries


@pytest.mark.protocol("§3")
async def test_a_delivery_is_signed_and_carries_the_run_body() -> None:
    with trio.fail_after(10):
        async with one_harness() as (server, creds, ws):
            run_id = await server.submit_run(
                "fix the test", conversation_id="C42", author="dana", mcp=None
            )
            delivery = await next_of(ws, "delivery")
    assert delivery["event"] == "agent.run"
    assert delivery["id"].startswith("dlv_")
    assert isinstance(delivery["body"], str)
    problem = check(
        creds["secret"], delivery["timestamp"], delivery["body"], delivery["signature"], time.time()
    )
    assert problem is None
    body = body_of(delivery)
    assert body["run_id"] == run_id
    assert body["conversation_id"] == "C42"
    assert body["kind"] == "message"
    assert body["text"] == "fix the test"
    assert body["author"] == "dana"
    assert body["completion_path"] == f"/v1/agent/runs/{run_id}/complete"
    assert body["timeline_path"] == f"/v1/agent/runs/{run_id}/timeline"
    assert body["context"] == [] and "instructions" in body and "mcp" in body
    record = server.run(run_id)
    assert record.state == "delivered"
    assert record.delivery_count == 1
    assert record.body_text == delivery["body"]


async def test_a_run_submitted_before_any_harness_waits_for_one() -> None:
    with trio.fail_after(10):
        async with running_server() as server:
            run_id = await server.submit_run("early")
            assert server.run(run_id).state == "queued"
            creds = server.pair("m1")
            async with harness(creds) as ws:
                assert body_of(await next_of(ws, "delivery"))["run_id"] == run_id


@pytest.mark.protocol("§2")
async def test_unacked_delivery_is_sent_again_and_on_reconnect_but_not_after_an_ack(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(600):
        async with running_server(**REDELIVERING) as server:
            creds = server.pair("m1")
            async with harness(creds) as ws:
                run_id = await server.submit_run("hi")
                first = await next_of(ws, "delivery")
                second = await next_of(ws, "delivery")
                assert second["id"] != first["id"]
                assert body_of(second)["run_id"] == run_id
                assert second["body"] == first["body"]
            # The harness went away unacked: a new connection gets it again.
            async with harness(creds) as ws:
                third = await next_of(ws, "delivery")
                assert body_of(third)["run_id"] == run_id
                await ack(ws, third)
                await server.wait_until(lambda s: s.runs[run_id].state == "accepted")
                await no_more_deliveries(ws, "redelivered after an ack")
            async with harness(creds) as ws:
                await no_more_deliveries(ws, "redelivered on reconnect after an ack")
    record = server.run(run_id)
    assert record.delivery_count == 3
    assert record.ack_statuses == [200]
    assert record.acks[0].delivery_id == third["id"]
    assert record.harness == creds["token"]


@pytest.mark.protocol("§3")
async def test_ack_503_is_redelivered_later_and_ack_400_fails_the_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(600):
        async with one_harness(**REDELIVERING) as (server, _creds, ws):
            draining = await server.submit_run("later please")
            first = await next_of(ws, "delivery")
            await ack(ws, first, 503)
            await server.wait_until(lambda s: s.runs[draining].state == "queued")
            again = await next_of(ws, "delivery")
            assert body_of(again)["run_id"] == draining
            await ack(ws, again)

            bad = await server.submit_run("bad")
            delivery = await next_of(ws, "delivery")
            await ack(ws, delivery, 400, "body.text: expected str")
            await server.wait_until(lambda s: s.runs[bad].state == "failed")
            await no_more_deliveries(ws, "a failed run was redelivered")
    assert server.run(draining).ack_statuses == [503, 200]
    assert server.run(draining).state == "accepted"
    assert "body.text: expected str" in (server.run(bad).error or "")


@pytest.mark.protocol("§3")
async def test_a_503_moves_the_run_to_another_harness(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(600):
        async with running_server(**REDELIVERING) as server:
            a, b = server.pair("a"), server.pair("b")
            async with harness(a, "a") as ws_a:
                run_id = await server.submit_run("work")
                await ack(ws_a, await next_of(ws_a, "delivery"), 503)
                async with harness(b, "b") as ws_b:
                    delivery = await next_of(ws_b, "delivery")
                    assert body_of(delivery)["run_id"] == run_id
                    await ack(ws_b, delivery)
                    await server.wait_until(lambda s: s.runs[run_id].state == "accepted")
    assert server.run(run_id).harness == b["token"]


async def test_a_conversation_sticks_to_the_harness_that_took_its_first_run() -> None:
    with trio.fail_after(10):
        async with running_server() as server:
            a, b = server.pair("a"), server.pair("b")
            async with harness(a, "a") as ws_a, harness(b, "b") as ws_b:
                await server.wait_until(lambda s: s.connected == 2)
                first = await server.submit_run("one", conversation_id="C1")
                await server.wait_until(lambda s: s.runs[first].state == "delivered")
                sticky_ws, other_ws = (
                    (ws_a, ws_b) if server.run(first).harness == a["token"] else (ws_b, ws_a)
                )
                await ack(sticky_ws, await next_of(sticky_ws, "delivery"))
                # Another conversation goes to the idle harness…
                elsewhere = await server.submit_run("two", conversation_id="C2")
                delivery = await next_of(other_ws, "delivery")
                assert body_of(delivery)["run_id"] == elsewhere
                await ack(other_ws, delivery)
                # …and C1's next turns stay where C1 began, however busy that is.
                seconds = [
                    await server.submit_run(f"more {n}", conversation_id="C1") for n in range(2)
                ]
                for run_id in seconds:
                    delivery = await next_of(sticky_ws, "delivery")
                    assert body_of(delivery)["run_id"] == run_id
                    await ack(sticky_ws, delivery)
    holder = server.run(first).harness
    assert all(server.run(r).harness == holder for r in seconds)
    assert server.run(elsewhere).harness != holder


async def test_a_conversation_moves_when_its_harness_is_gone() -> None:
    with trio.fail_after(10):
        async with running_server() as server:
            a, b = server.pair("a"), server.pair("b")
            async with harness(b, "b") as ws_b:
                await server.submit_run("keeps b busy")
                await ack(ws_b, await next_of(ws_b, "delivery"))
                async with harness(a, "a") as ws_a:
                    first = await server.submit_run("one", conversation_id="C1")
                    await ack(ws_a, await next_of(ws_a, "delivery"))
                    assert server.run(first).harness == a["token"]
                await server.wait_until(lambda s: s.connected == 1)
                second = await server.submit_run("two", conversation_id="C1")
                assert body_of(await next_of(ws_b, "delivery"))["run_id"] == second


# ---------------------------------------------------------------------- cancel and heartbeats


@pytest.mark.protocol("§6")
async def test_cancelling_an_accepted_run_tells_its_harness_until_it_completes() -> None:
    with trio.fail_after(10):
        async with one_harness() as (server, creds, ws):
            run_id = await server.submit_run("long")
            await ack(ws, await next_of(ws, "delivery"))
            await server.wait_until(lambda s: s.runs[run_id].state == "accepted")
            async with httpx.AsyncClient(base_url=server.http_url,
                                         headers=api_headers(server)) as client:
                answer = await client.delete(f"/v1/runs/{run_id}")
            assert answer.status_code == 200
            cancel = await next_of(ws, "cancel")
            assert cancel == {
                "type": "cancel",
                "run_id": run_id,
                "reason": "cancelled by the user",
            }
            assert (await beat(ws, 1, run_id))["cancel"] == [run_id]
            # Listed even when the harness does not mention it.
            assert (await beat(ws, 2))["cancel"] == [run_id]
            response = await complete(
                server, creds, run_id, failure(run_id, "cancelled: cancelled by the user")
            )
            assert response.status_code == 200
            assert (await beat(ws, 3, run_id)) == {
                "type": "heartbeat_ack",
                "seq": 3,
                "cancel": [],
                "unknown": [],
            }
    record = server.run(run_id)
    assert record.state == "failed"
    assert record.error == "cancelled: cancelled by the user"


async def test_cancelling_a_run_before_it_is_accepted_stops_its_deliveries(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(600):
        async with one_harness(**REDELIVERING) as (server, _creds, ws):
            run_id = await server.submit_run("never mind")
            delivery = await next_of(ws, "delivery")
            await server.cancel_run(run_id, "changed my mind")
            assert server.run(run_id).state == "cancelled"
            await no_more_deliveries(ws, "a cancelled run was redelivered")
            # The ack was in flight: the harness holds it now, so it hears the cancel.
            await ack(ws, delivery)
            cancel = await next_of(ws, "cancel")
            assert cancel["reason"] == "changed my mind"
            assert (await beat(ws, 1, run_id))["cancel"] == [run_id]
    assert server.run(run_id).state == "cancelled"


@pytest.mark.protocol("§2")
async def test_heartbeat_ack_lists_closed_and_unknown_runs() -> None:
    with trio.fail_after(10):
        async with one_harness() as (server, creds, ws):
            kept = await server.submit_run("kept")
            closed = await server.submit_run("closed")
            for _ in range(2):
                await ack(ws, await next_of(ws, "delivery"))
            await server.wait_until(
                lambda s: all(s.runs[r].state == "accepted" for r in (kept, closed))
            )
            server.close_run(closed)
            answer = await beat(ws, 41, kept, closed, "run_never_seen")
            assert answer == {
                "type": "heartbeat_ack",
                "seq": 41,
                "cancel": [],
                "unknown": [closed, "run_never_seen"],
            }
            late = await complete(server, creds, closed)
    assert late.status_code == 404
    assert server.run(closed).state == "closed"
    last_beat = server.run(kept).last_beat
    assert last_beat is not None and last_beat["state"] == "running"


async def test_status_and_every_message_are_recorded_in_order() -> None:
    with trio.fail_after(10):
        async with one_harness() as (server, _creds, ws):
            await send(
                ws,
                type="status",
                version="0.1.0",
                machine="studio",
                brain="claude",
                concurrency=2,
                active=0,
                queued=0,
                draining=False,
                features=["cancel"],
            )
            await beat(ws, 1)
            conn = next(iter(server.state.connections.values()))
            assert conn.status is not None and conn.status.brain == "claude"
            assert conn.agent == "prohost-python/test"
    kinds = [type(entry.message) for entry in server.state.received]
    assert kinds == [Status, Heartbeat]
    assert {entry.connection_id for entry in server.state.received} == {conn.id}


# ---------------------------------------------------------------------- completions


@pytest.mark.protocol("§7")
async def test_completion_is_accepted_once_then_409() -> None:
    with trio.fail_after(10):
        async with one_harness() as (server, creds, ws):
            run_id = await server.submit_run("hi")
            await ack(ws, await next_of(ws, "delivery"))
            first = await complete(
                server,
                creds,
                run_id,
                {
                    "run_id": run_id,
                    "ok": True,
                    "reply": "done",
                    "session_id": "s1",
                },
            )
            second = await complete(server, creds, run_id)
    assert first.status_code == 200
    assert second.status_code == 409
    record = server.run(run_id)
    assert record.state == "completed"
    assert record.reply == "done"
    assert record.completion == {"run_id": run_id, "ok": True, "reply": "done", "session_id": "s1"}
    assert record.completion_posts == 2
    assert record.idempotency_keys == [run_id, run_id]


@pytest.mark.protocol("§7")
async def test_completion_errors_401_404_400() -> None:
    with trio.fail_after(10):
        async with running_server() as server:
            creds = server.pair("m1")
            run_id = await server.submit_run("hi")
            no_token = await complete(server, None, run_id)
            bad_token = await complete(server, {"token": "forged"}, run_id)
            unknown = await complete(server, creds, "run_nope")
            not_json = await complete(server, creds, run_id, content=b"{oops")
            no_ok = await complete(server, creds, run_id, {"run_id": run_id})
            other_run = await complete(server, creds, run_id, {"run_id": "run_x", "ok": True})
    assert no_token.status_code == 401
    assert bad_token.status_code == 401
    assert unknown.status_code == 404
    assert not_json.status_code == 400 and "not JSON" in not_json.json()["error"]
    assert no_ok.status_code == 400
    assert other_run.status_code == 400
    assert server.run(run_id).completion is None


@pytest.mark.protocol("§7", "§13")
async def test_completion_confined_is_kept_and_must_be_a_bool() -> None:
    with trio.fail_after(10):
        async with running_server() as server:
            creds = server.pair("m1")
            run_id = await server.submit_run("hi")
            wrong = await complete(server, creds, run_id,
                                   {"run_id": run_id, "ok": True, "reply": "x", "confined": "yes"})
            right = await complete(server, creds, run_id,
                                   {"run_id": run_id, "ok": True, "reply": "x", "confined": False})
    assert wrong.status_code == 400 and "confined" in wrong.json()["error"]
    assert right.status_code == 200
    completion = server.run(run_id).completion
    assert completion is not None and completion["confined"] is False


async def test_completion_faults_are_answered_in_order_before_normal_handling() -> None:
    with trio.fail_after(10):
        async with running_server() as server:
            creds = server.pair("m1")
            run_id = await server.submit_run("hi")
            server.state.completion_faults.extend([(503, {}), (429, {"Retry-After": "7"})])
            statuses = []
            retry_after = []
            for _ in range(3):
                response = await complete(server, creds, run_id)
                statuses.append(response.status_code)
                retry_after.append(response.headers.get("retry-after"))
    assert statuses == [503, 429, 200]
    assert retry_after == [None, "7", None]
    assert server.state.completion_faults == []
    assert server.run(run_id).completion_posts == 3
    assert server.run(run_id).state == "completed"


@pytest.mark.protocol("§7", "§8")
async def test_a_failed_completion_and_a_timeline() -> None:
    with trio.fail_after(10):
        async with running_server() as server:
            creds = server.pair("m1")
            run_id = await server.submit_run("hi")
            event = {
                "id": "toolu_1",
                "name": "Bash",
                "state": "done",
                "summary": "pytest -q",
                "at": 1.0,
            }
            headers = {"Authorization": f"Bearer {creds['token']}"}
            async with httpx.AsyncClient(base_url=server.http_url) as client:
                timeline = await client.post(
                    f"/v1/agent/runs/{run_id}/timeline",
                    json={"run_id": run_id, "events": [event]},
                    headers=headers,
                )
                anonymous = await client.post(
                    f"/v1/agent/runs/{run_id}/timeline", json={"run_id": run_id, "events": []}
                )
                failed = await complete(server, creds, run_id, failure(run_id, "exit 1"))
                view = (await client.get(f"/v1/runs/{run_id}")).json()
    assert timeline.status_code == 200
    assert anonymous.status_code == 401
    assert failed.status_code == 200
    assert view["state"] == "failed"
    assert view["error"] == "exit 1"
    assert view["reply"] is None
    assert view["timeline"] == [event]


# ---------------------------------------------------------------------- robustness


@pytest.mark.protocol("§2")
async def test_malformed_frames_do_not_end_the_connection() -> None:
    with trio.fail_after(10):
        async with one_harness() as (server, _creds, ws):
            for junk in [
                "not json",
                "[1, 2]",
                "{}",
                '{"type": 5}',
                '{"type": "ack", "id": 1, "status": "200", "reason": null}',
                '{"type": "heartbeat", "seq": "x"}',
                '{"type": "ack", "id": "dlv_unknown", "status": 200, "reason": ""}',
                '{"type": "something_new", "x": 1}',
            ]:
                await ws.send_message(junk)
            await ws.send_message(b"\x00binary")
            answer = await beat(ws, 7)
            assert answer["seq"] == 7
            assert server.state.connected == 1
    assert len(server.state.malformed) == 7
    assert server.state.total_connects == 1


async def test_send_raw_reaches_every_harness_and_drop_connections_aborts_them() -> None:
    with trio.fail_after(10):
        async with running_server() as server:
            a, b = server.pair("a"), server.pair("b")
            async with harness(a, "a") as ws_a, harness(b, "b") as ws_b:
                await server.send_raw('{"type": "made_up"}')
                assert json.loads(await ws_a.get_message()) == {"type": "made_up"}
                assert json.loads(await ws_b.get_message()) == {"type": "made_up"}
                await server.drop_connections()
                assert server.state.connected == 0
                for ws in (ws_a, ws_b):
                    with pytest.raises(trio_websocket.ConnectionClosed) as caught:
                        await ws.get_message()
                    # No close frame: the client sees the connection vanish.
                    assert caught.value.reason is not None
                    assert caught.value.reason.code == 1006
            async with harness(a, "a"):
                await server.wait_until(lambda s: s.connected == 1)
    assert server.state.total_connects == 3
    assert [e.kind for e in server.state.connection_events].count("disconnect") == 3


async def test_shutdown_closes_harness_sockets_with_going_away() -> None:
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            server: ServerHandle = await nursery.start(serve, ServerConfig())
            creds = server.pair("m1")
            async with harness(creds) as ws:
                server.shutdown()
                with pytest.raises(trio_websocket.ConnectionClosed) as caught:
                    await next_of(ws, "never")
            assert caught.value.reason is not None
            assert caught.value.reason.code == 1001
        # serve() returned by itself: the nursery closed without a cancel.


async def test_wait_until_wakes_on_each_change() -> None:
    with trio.fail_after(10):
        async with running_server() as server:
            seen: list[int] = []

            async def watch() -> None:
                def has_two(state: ServerState) -> bool:
                    seen.append(len(state.runs))
                    return len(state.runs) == 2

                await server.wait_until(has_two)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch)
                await trio.testing.wait_all_tasks_blocked()
                await server.submit_run("one")
                await trio.testing.wait_all_tasks_blocked()
                await server.submit_run("two")
    assert seen[0] == 0 and seen[-1] == 2


# ---------------------------------------------------------------------- run API and send


async def test_run_api_submit_list_get_cancel_and_errors() -> None:
    with trio.fail_after(10):
        async with (
            running_server() as server,
            httpx.AsyncClient(base_url=server.http_url, headers=api_headers(server)) as client,
        ):
            created = await client.post(
                "/v1/runs", json={"conversation_id": "C1", "text": "hi", "author": "sam"}
            )
            run_id = created.json()["run_id"]
            listed = (await client.get("/v1/runs")).json()["runs"]
            one = (await client.get(f"/v1/runs/{run_id}")).json()
            cancelled = await client.delete(f"/v1/runs/{run_id}")
            gone = await client.get("/v1/runs/run_nope")
            no_text = await client.post("/v1/runs", json={"conversation_id": "C1"})
            bad_json = await client.post("/v1/runs", content=b"text=hi")
            wrong_method = await client.put("/v1/runs")
            nowhere = await client.get("/v2/whatever")
    assert created.status_code == 201
    assert [r["run_id"] for r in listed] == [run_id]
    assert one["state"] == "queued" and one["conversation_id"] == "C1"
    assert server.run(run_id).body["author"] == "sam"
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    assert gone.status_code == 404
    assert no_text.status_code == 400 and "text" in no_text.json()["error"]
    assert bad_json.status_code == 400 and "not JSON" in bad_json.json()["error"]
    assert wrong_method.status_code == 405
    assert nowhere.status_code == 404


async def fake_harness_that_replies(
    server: ServerHandle, reply: str | None, *, ok: bool = True,
    extra: dict[str, Any] | None = None,
) -> None:
    """Take one delivery, ack it and post the given completion (with ``extra`` keys)."""
    creds = server.pair("fake")
    async with harness(creds) as ws:
        delivery = await next_of(ws, "delivery")
        await ack(ws, delivery)
        run_id = body_of(delivery)["run_id"]
        payload = ({"run_id": run_id, "ok": True, "reply": reply} if ok
                   else failure(run_id, "the agent exited with status 1"))
        assert (await complete(server, creds, run_id, {**payload, **(extra or {})})
                ).status_code == 200


@pytest.mark.parametrize(
    ("reply", "ok", "code", "printed"),
    [
        ("Fixed: the fixture path was wrong.", True, 0, "Fixed: the fixture path was wrong."),
        (None, True, 0, "(no reply)"),
        (None, False, 1, None),
    ],
)
async def test_send_waits_for_the_reply(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    reply: str | None,
    ok: bool,
    code: int,
    printed: str | None,
) -> None:
    with trio.fail_after(20):
        async with running_server(token_dir=tmp_path) as server, trio.open_nursery() as nursery:
            nursery.start_soon(partial(fake_harness_that_replies, server, reply, ok=ok))
            status = await send_command(server.http_url, "fix it", "C7", wait=True, timeout_s=15,
                                        server_state=str(tmp_path))
    out, err = capsys.readouterr()
    lines = out.splitlines()
    (run_id,) = server.state.runs
    assert status == code
    assert lines[0] == run_id
    assert server.run(run_id).conversation_id == "C7"
    if printed is None:
        assert len(lines) == 1
        assert "the agent exited with status 1" in err
    else:
        assert lines[1:] == [printed]


#: A completion's §7 extras, as docs/protocol.md's example has them.
WHAT_IT_DID = {
    "usage": {"input_tokens": 1200, "output_tokens": 380, "cache_read_tokens": 900,
              "cache_write_tokens": 50, "cost_usd": 0.0123, "turns": 3,
              "model": "claude-sonnet-4-5"},
    "changes": [{"repo": "app", "branch": "prohost/C7", "base": "a" * 40, "head": "b" * 40,
                 "commits": 1, "more_files": 0, "files": [
                     {"path": "src/app.py", "change": "modified", "added": 10, "removed": 2,
                      "committed": True},
                     {"path": "notes/plan.md", "change": "added", "added": 3, "removed": 0,
                      "committed": False}]},
                {"repo": "docs", "error": "git status took longer than 5 s and was stopped"}],
}


@pytest.mark.parametrize("ok", [True, False])
async def test_send_prints_what_the_run_changed_and_used(
    capsys: pytest.CaptureFixture[str], ok: bool, tmp_path: Path,
) -> None:
    with trio.fail_after(20):
        async with running_server(token_dir=tmp_path) as server, trio.open_nursery() as nursery:
            nursery.start_soon(partial(fake_harness_that_replies, server, "Fixed.", ok=ok,
                                       extra=WHAT_IT_DID))
            status = await send_command(server.http_url, "fix it", "C7", wait=True, timeout_s=15,
                                        server_state=str(tmp_path))
            (run_id,) = server.state.runs
            view = server.state.run_view(server.run(run_id))
    assert status == (0 if ok else 1)
    assert (view["usage"], view["changes"]) == (WHAT_IT_DID["usage"], WHAT_IT_DID["changes"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:] == (["Fixed."] if ok else []) + [
        "",
        "changes:",
        "  app: 2 files (+13 −2), 1 commit on prohost/C7",
        "    M src/app.py +10 −2",
        "    A notes/plan.md +3 −0 (not committed)",
        "  docs: could not be read (git status took longer than 5 s and was stopped)",
        "usage: 1,200 in · 380 out tokens (900 cached) · $0.0123 · 3 turns · claude-sonnet-4-5",
    ]


async def test_send_without_wait_prints_the_run_id(
    capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    with trio.fail_after(10):
        async with running_server(token_dir=tmp_path) as server:
            status = await send_command(server.ws_url, "hello", None, wait=False,
                                        server_state=str(tmp_path))
    assert status == 0
    (run_id,) = server.state.runs
    assert capsys.readouterr().out == f"{run_id}\n"
    assert server.run(run_id).conversation_id is None


async def test_send_explains_an_unreachable_server_and_a_bad_answer(
    capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    with trio.fail_after(10):
        # A port that was just free: nothing listens there.
        listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
        port = listener.socket.getsockname()[1]
        await listener.aclose()
        write_token(tmp_path, new_token())  # a token from a server that stopped since
        assert await send_command(f"http://127.0.0.1:{port}", "hi", None, wait=True,
                                  server_state=str(tmp_path)) == 1
        unreachable = capsys.readouterr().err
        async with running_server(token_dir=tmp_path) as server:
            assert await send_command(server.http_url + "/v1", "", None, wait=False,
                                      server_state=str(tmp_path)) == 0
            capsys.readouterr()
            assert await send_command("ftp://example", "hi", None, wait=False) == 1
            bad_scheme = capsys.readouterr().err
    assert unreachable.startswith("prohost send: cannot reach the server")
    assert unreachable.count("\n") == 1
    assert "not a server address" in bad_scheme


def test_api_base_accepts_http_ws_and_bare_addresses() -> None:
    assert api_base("http://h:1") == "http://h:1"
    assert api_base("ws://h:1/v1/agent/ws") == "http://h:1"
    assert api_base("wss://example.com/v1/agent/ws") == "https://example.com"
    assert api_base("h:8080") == "http://h:8080"


async def test_acks_are_recorded_with_their_reason() -> None:
    with trio.fail_after(10):
        async with one_harness() as (server, _creds, ws):
            run_id = await server.submit_run("x")
            delivery = await next_of(ws, "delivery")
            await ack(ws, delivery, 401, "signature does not match")
            await server.wait_until(lambda s: s.runs[run_id].state == "failed")
    (record,) = server.run(run_id).acks
    assert (record.status, record.reason, record.delivery_id) == (
        401,
        "signature does not match",
        delivery["id"],
    )
    assert isinstance(server.state.messages(Ack)[0], Ack)


@pytest.mark.protocol("§6")
async def test_a_cancelled_run_reported_retryable_is_never_submitted_again() -> None:
    # Issue 37 point 2: a harness killed -9 during the cancel's stop reports the run
    # "restarted" (retryable) after its restart; the server must not run the
    # cancelled request again.
    with trio.fail_after(10):
        async with one_harness(retries=3, retry_first_s=0.01) as (server, creds, ws):
            run_id = await server.submit_run("long")
            await ack(ws, await next_of(ws, "delivery"))
            await server.wait_until(lambda s: s.runs[run_id].state == "accepted")
            async with httpx.AsyncClient(base_url=server.http_url,
                                         headers=api_headers(server)) as client:
                assert (await client.delete(f"/v1/runs/{run_id}")).status_code == 200
            await next_of(ws, "cancel")
            restarted = {"run_id": run_id, "ok": False, "retryable": True,
                         "error": "the harness restarted before this run finished"}
            assert (await complete(server, creds, run_id, restarted)).status_code == 200
            record = server.run(run_id)
            assert record.state == "failed"
            assert record.retried_as is None
            assert [r for r in server.state.runs.values() if r.retry_of == run_id] == []
