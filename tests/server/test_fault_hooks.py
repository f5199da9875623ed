"""The reference server's fault hooks for the soak (issue 10): off by default, each
hook doing what the soak relies on, against real sockets and a real harness."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio_websocket

from prohost.server import ServerHandle, faults
from tests.kits.fake_harness import ack, complete, harness, next_of
from tests.kits.harness import api_headers, running_harness, running_server

pytestmark = pytest.mark.protocol("§11")

ROUTES = [
    ("GET", "/v1/faults"),
    ("GET", "/v1/faults/runs"),
    ("POST", "/v1/faults/drop"),
    ("POST", "/v1/faults/storm"),
    ("POST", "/v1/faults/restart"),
    ("POST", "/v1/faults/forget"),
    ("POST", "/v1/faults/redeliver"),
]


async def post(server: ServerHandle, path: str, **body: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.http_url,
                                 headers=api_headers(server)) as client:
        return await client.post(path, json=body)


async def accepted_run(server: ServerHandle, creds: dict[str, str], text: str = "hi") -> str:
    """A run a fake harness has been sent and has acked 200."""
    run_id = await server.submit_run(text)
    async with harness(creds) as ws:
        await ack(ws, await next_of(ws, "delivery"))
        await server.wait_until(lambda s: s.runs[run_id].state == "accepted")
    return run_id


async def test_without_the_flag_every_fault_route_is_404_and_changes_nothing() -> None:
    with trio.fail_after(10):
        async with (
            running_server() as server,
            httpx.AsyncClient(base_url=server.http_url, headers=api_headers(server)) as client,
        ):
            creds = server.pair("m1")
            async with harness(creds):
                await server.wait_until(lambda s: s.connected == 1)
                answers = [
                    await client.request(method, path, json={"status": 503, "down_s": 0})
                    for method, path in ROUTES
                ]
                assert server.state.connected == 1
    assert [a.status_code for a in answers] == [404] * len(ROUTES)
    assert server.state.completion_faults == []
    assert server.state.faults.view(0)["drops"] == 0
    assert server.state.faults.restarts == 0 and server.state.total_connects == 1


async def test_the_command_line_flag_turns_the_hooks_on_and_help_documents_them() -> None:
    async def fault_status(*flags: str) -> int:
        command = [sys.executable, "-m", "prohost", "server", "--port", "0", "--no-state", *flags]
        process = await trio.lowlevel.open_process(command, stdout=subprocess.PIPE)
        try:
            assert process.stdout is not None
            output = b""
            while b"HTTP:" not in output or not output.endswith(b"\n"):
                chunk = await process.stdout.receive_some()
                assert chunk, f"prohost server ended early: {output!r}"
                output += chunk
            url = next(
                line.split()[-1] for line in output.decode().splitlines() if "HTTP:" in line
            )
            token_file = next(line.split()[2] for line in output.decode().splitlines()
                              if "API token:" in line)
            token = (await trio.Path(token_file).read_text()).strip()
            async with httpx.AsyncClient() as client:
                status = (await client.get(f"{url}/v1/faults", headers={
                    "Authorization": f"Bearer {token}"})).status_code
            assert (b"fault hooks:" in output) == bool(flags)
        finally:
            process.send_signal(signal.SIGINT)
            with trio.move_on_after(10) as waited:
                await process.wait()
            if waited.cancelled_caught:
                process.kill()
                await process.wait()
        assert process.returncode == 0
        return status

    with trio.fail_after(60):
        assert await fault_status() == 404
        assert await fault_status("--faults") == 200
        helped = await trio.run_process(
            [sys.executable, "-m", "prohost", "server", "--help"], capture_stdout=True
        )
    text = " ".join(helped.stdout.decode().split())
    for hook in ("--faults", "/v1/faults/drop", "/v1/faults/storm", "/v1/faults/restart",
                 "/v1/faults/forget", "/v1/faults/runs", "retry_after"):
        assert hook in text, hook


async def test_drop_aborts_every_harness_socket_without_a_close_frame() -> None:
    with trio.fail_after(10):
        async with running_server(faults=True) as server:
            a, b = server.pair("a"), server.pair("b")
            async with harness(a, "a") as ws_a, harness(b, "b") as ws_b:
                await server.wait_until(lambda s: s.connected == 2)
                answer = await post(server, "/v1/faults/drop")
                for ws in (ws_a, ws_b):
                    with pytest.raises(trio_websocket.ConnectionClosed) as caught:
                        await next_of(ws, "never")
                    assert caught.value.reason is not None
                    assert caught.value.reason.code == 1006
                await server.wait_until(lambda s: s.connected == 0)
    assert answer.status_code == 200 and answer.json() == {"dropped": 2}
    assert server.state.faults.drops == 1


async def test_a_storm_answers_the_next_completions_then_lets_them_through() -> None:
    with trio.fail_after(20):
        async with running_server(faults=True) as server:
            creds = server.pair("m1")
            run_id = await accepted_run(server, creds)
            bad_status = await post(server, "/v1/faults/storm", status=404, count=1)
            bad_count = await post(server, "/v1/faults/storm", status=503, count=0)
            started = await post(server, "/v1/faults/storm", status=429, count=2, retry_after=3)
            answers = [await complete(server, creds, run_id) for _ in range(3)]
            async with httpx.AsyncClient(base_url=server.http_url,
                                         headers=api_headers(server)) as client:
                (row,) = (await client.get("/v1/faults/runs")).json()["runs"]
    assert bad_status.status_code == 400 and "408, 429, 500, 502, 503" in bad_status.text
    assert bad_count.status_code == 400 and "count" in bad_count.json()["error"]
    assert started.json() == {"storm_left": 2}
    assert [a.status_code for a in answers] == [429, 429, 200]
    assert [a.headers.get("retry-after") for a in answers] == ["3", "3", None]
    assert server.run(run_id).state == "completed"
    assert row["run_id"] == run_id and row["acked"] is True and row["state"] == "completed"
    assert [p["status"] for p in row["posts"]] == [429, 429, 200]
    assert row["posts"][-1]["body"] == {"run_id": run_id, "ok": True, "reply": "done"}


async def test_forget_drops_one_valid_completion_so_the_run_is_never_settled() -> None:
    with trio.fail_after(20):
        async with running_server(faults=True) as server:
            creds = server.pair("m1")
            forgotten = await accepted_run(server, creds, "forgotten")
            kept = await accepted_run(server, creds, "kept")
            unknown = await post(server, "/v1/faults/forget", run_id="run_nope")
            armed = await post(server, "/v1/faults/forget", run_id=forgotten)
            first = await complete(server, creds, forgotten)
            normal = await complete(server, creds, kept)
            # A second, different report of the kept run is visible to the soak.
            other = {"run_id": kept, "ok": False, "error": "a different answer"}
            twice = await complete(server, creds, kept, other)
    assert unknown.status_code == 400 and "run_id" in unknown.json()["error"]
    assert armed.json()["forget_runs"] == [forgotten]
    assert (first.status_code, normal.status_code, twice.status_code) == (200, 200, 409)
    rows = {row["run_id"]: row for row in server.audit()}
    assert rows[forgotten]["state"] == "accepted" and rows[forgotten]["acked"] is True
    assert [(p["status"], p["forgotten"]) for p in rows[forgotten]["posts"]] == [(200, True)]
    assert server.run(forgotten).completion is None
    assert rows[kept]["state"] == "completed"
    assert [p["body"]["ok"] for p in rows[kept]["posts"]] == [True, False]
    assert [p["status"] for p in rows[kept]["posts"]] == [200, 409]
    assert server.state.faults.forgotten == 1


async def test_redeliver_sends_a_reported_run_again_and_records_the_ack() -> None:
    """The soak redelivers runs in flight and already reported (issue 10)."""
    with trio.fail_after(20):
        async with running_server(faults=True) as server:
            creds = server.pair("m1")
            nobody = await post(server, "/v1/faults/redeliver", run_id="run_nope")
            run_id = await accepted_run(server, creds, "reported once")
            assert (await complete(server, creds, run_id)).status_code == 200
            alone = await post(server, "/v1/faults/redeliver", run_id=run_id)
            async with harness(creds) as ws:
                await server.wait_until(lambda s: s.connected == 1)
                again = await post(server, "/v1/faults/redeliver", run_id=run_id)
                delivery = await next_of(ws, "delivery")
                await ack(ws, delivery, status=204)
                await server.wait_until(lambda s: 204 in s.runs[run_id].ack_statuses)
    assert nobody.status_code == 400 and "run_id" in nobody.json()["error"]
    assert alone.status_code == 409  # no harness connected
    assert again.status_code == 200 and again.json()["state"] == "completed"
    assert delivery["id"] == again.json()["delivery_id"]
    assert json.loads(delivery["body"])["run_id"] == run_id
    assert server.run(run_id).ack_statuses == [200, 204]


async def test_restart_refuses_connections_while_down_then_listens_on_the_same_port(
    mock_clock: trio.testing.MockClock,
) -> None:
    # Virtual time moves only when the test jumps it, so the port stays closed
    # while the test looks; after 5 real seconds of nothing at all it moves by
    # itself, so a hang ends in fail_after rather than never.
    mock_clock.autojump_threshold = 5
    with trio.fail_after(100):
        async with running_server(faults=True) as server:
            creds = server.pair("m1")
            run_id = await server.submit_run("survives the restart")
            port = int(server.http_url.rsplit(":", 1)[1])
            async with harness(creds) as ws:
                await ack(ws, await next_of(ws, "delivery"))
                await server.wait_until(lambda s: s.runs[run_id].state == "accepted")
                faults.request_restart(server.state, 30)
                with pytest.raises(trio_websocket.ConnectionClosed):
                    await next_of(ws, "never")
            await server.wait_until(lambda s: not s.faults.listening)
            with pytest.raises(OSError):
                await trio.open_tcp_stream("127.0.0.1", port)
            assert server.state.faults.restarts == 1
            mock_clock.jump(30)
            await server.wait_until(lambda s: s.faults.listening)
            # Same port, same pairing, same runs.
            async with harness(creds) as ws:
                await server.wait_until(lambda s: s.connected == 1)
            answer = await complete(server, creds, run_id)
    assert answer.status_code == 200
    assert server.run(run_id).state == "completed"
    assert server.state.total_connects == 2


async def test_a_real_harness_comes_back_after_a_restart_through_the_route(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        async with running_server(faults=True) as server:
            async with running_harness(server, tmp_path, dry_run=True):
                before = await server.submit_run("before")
                await server.wait_until(lambda s: s.runs[before].state == "accepted")
                answer = await post(server, "/v1/faults/restart", down_s=0)
                await server.wait_until(lambda s: s.faults.restarts == 1)
                await server.wait_until(lambda s: s.total_connects == 2 and s.connected == 1)
                after = await server.submit_run("after")
                await server.wait_until(lambda s: s.runs[after].state == "accepted")
            async with httpx.AsyncClient(base_url=server.http_url,
                                         headers=api_headers(server)) as client:
                view = (await client.get("/v1/faults")).json()
    assert answer.status_code == 202 and answer.json() == {"down_s": 0.0}
    assert view["restarts"] == 1 and view["listening"] is True
    assert json.loads(json.dumps(server.audit()))[0]["acked"] is True
