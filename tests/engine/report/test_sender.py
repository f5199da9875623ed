"""What the harness posts its reports through (prohost.engine.report.sender): httpx's
own transport, through the environment's proxy for the server where it names one.

The reporter's guarantees are checked here over the sender the harness opens, against
a real HTTP server (hypercorn on 127.0.0.1 port 0, or a raw trio TCP server where the
test needs to see the connection itself).
"""

from __future__ import annotations

import gzip
import json
import logging
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from prohost.engine.report.reporter import DRAIN_BYTES, SNIPPET_CHARS, Reporter
from prohost.engine.report.sender import open_sender
from tests.kits.asgi import lifespan, read_body, serving
from tests.kits.reporter import (
    HANG,
    PATH,
    PAYLOAD,
    RUN,
    TOKEN,
    FixedRandom,
    ScriptedApp,
    completed_holding_little,
    free_port,
    gaps,
)

PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture(autouse=True)
def _no_proxy_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test says which proxy variables it sets (none, unless it is about them)."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


@asynccontextmanager
async def reporter_over(app: Any, **kwargs: Any) -> AsyncIterator[Reporter]:
    """A reporter for ``app`` served on loopback, over the harness's own sender."""
    async with serving(app) as base, open_sender(base) as sender:
        yield Reporter(sender, base, TOKEN, **kwargs)


class RawServer:
    """A bare HTTP/1.1 server on loopback that answers every request ``200 {}`` on a
    kept-alive connection, and records each request line and when a connection ends
    (so a test sees the harness close it, or a proxy being asked for a full URL)."""

    def __init__(self) -> None:
        self.request_lines: list[str] = []
        self.connections = 0
        self.ended = 0
        self.changed = trio.Event()

    async def handle(self, stream: trio.abc.Stream) -> None:
        self.connections += 1
        data = b""
        try:
            while True:
                while b"\r\n\r\n" not in data:
                    chunk = await stream.receive_some()
                    if not chunk:
                        return
                    data += chunk
                head, _, data = data.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                self.request_lines.append(lines[0])
                length = next((int(line.split(":", 1)[1]) for line in lines[1:]
                               if line.lower().startswith("content-length:")), 0)
                while len(data) < length:
                    chunk = await stream.receive_some()
                    if not chunk:
                        return
                    data += chunk
                data = data[length:]
                await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        except trio.BrokenResourceError:
            return  # a TLS handshake the client refused
        finally:
            self.ended += 1
            self.changed.set()
            self.changed = trio.Event()

    async def until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            await self.changed.wait()


@asynccontextmanager
async def raw_server(tls: ssl.SSLContext | None = None) -> AsyncIterator[tuple[RawServer, str]]:
    """A :class:`RawServer` on 127.0.0.1 port 0 (over TLS with ``tls``); yields it and
    its base URL."""
    server = RawServer()
    async with trio.open_nursery() as nursery:
        if tls is None:
            [listener] = await nursery.start(
                partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1"))
            port = listener.socket.getsockname()[1]
        else:
            [listener] = await nursery.start(
                partial(trio.serve_ssl_over_tcp, server.handle, 0, tls, host="127.0.0.1"))
            port = listener.transport_listener.socket.getsockname()[1]
        yield server, f"{'http' if tls is None else 'https'}://127.0.0.1:{port}"
        nursery.cancel_scope.cancel()


def self_signed(folder: Path) -> tuple[Path, ssl.SSLContext]:
    """A certificate for 127.0.0.1 that no CA signed (made by the openssl command),
    and a server context that presents it."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return cert, context


# --- the harness's sender ----------------------------------------------------------


@pytest.mark.protocol("§7", "§8")
async def test_the_server_gets_the_request_a_client_would_send(autojump_clock: Any) -> None:
    """Method, path, every header of ``httpx.AsyncClient()``'s defaults and the body:
    a completion and a timeline post look to the server as a client's would."""
    app = ScriptedApp((200, {}, b"{}"))
    async with reporter_over(app) as reporter:
        assert (await reporter.complete(RUN, PATH, PAYLOAD)).kind == "delivered"
        assert await reporter.post_timeline(RUN, "/t", [{"id": "x"}])
    async with httpx.AsyncClient() as client:
        defaults = {name.lower(): value for name, value in client.headers.items()}
    assert [(s.method, s.path) for s in app.seen] == [("POST", PATH), ("POST", "/t")]
    for seen in app.seen:
        headers = {name.lower(): value for name, value in seen.headers.items()}
        assert defaults.items() <= headers.items()
        assert headers["authorization"] == f"Bearer {TOKEN}"
    assert json.loads(app.seen[0].body) == PAYLOAD


async def test_the_harness_closes_its_connections_when_the_sender_block_ends() -> None:
    with trio.fail_after(20):
        async with raw_server() as (server, base):
            async with open_sender(base) as sender:
                reporter = Reporter(sender, base, TOKEN)
                for run_id in ("run_a", "run_b"):
                    settled = await reporter.complete(run_id, PATH, PAYLOAD)
                    assert settled.kind == "delivered"
                # Kept for the next POST: one connection, still open.
                assert (server.connections, server.ended) == (1, 0)
            await server.until(lambda: server.ended == 1)
    assert server.request_lines == [f"POST {PATH} HTTP/1.1"] * 2


@pytest.mark.parametrize("variable", ["HTTP_PROXY", "http_proxy", "ALL_PROXY"])
async def test_a_proxy_in_the_environment_is_still_used(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    """As ``httpx.AsyncClient()`` would: with a proxy variable set, the completion
    goes to the proxy, asked for the server's full URL."""
    with trio.fail_after(20):
        async with raw_server() as (proxy, proxy_url):
            monkeypatch.setenv(variable, proxy_url)
            async with open_sender("http://api.example.invalid") as sender:
                reporter = Reporter(sender, "http://api.example.invalid", TOKEN)
                settled = await reporter.complete(RUN, PATH, PAYLOAD)
    assert settled.kind == "delivered"
    assert proxy.request_lines == [f"POST http://api.example.invalid{PATH} HTTP/1.1"]


async def test_tls_is_verified_and_ssl_cert_file_honoured_as_before(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A server whose certificate no trusted CA signed is refused (no request sent);
    with ``SSL_CERT_FILE`` naming that certificate, the report is delivered."""
    cert, context = self_signed(tmp_path)
    with trio.fail_after(20):
        async with raw_server(context) as (server, base):
            async with open_sender(base) as sender:
                refused = await Reporter(sender, base, TOKEN).post_once(RUN, PATH, PAYLOAD)
            monkeypatch.setenv("SSL_CERT_FILE", str(cert))
            async with open_sender(base) as sender:
                trusted = await Reporter(sender, base, TOKEN).post_once(RUN, PATH, PAYLOAD)
    # The first connection was made and refused at the handshake: nothing was sent.
    assert (refused.kind, refused.status, refused.detail) == ("gave_up", None, "ConnectError")
    assert trusted.kind == "delivered"
    assert server.connections == 2
    assert server.request_lines == [f"POST {PATH} HTTP/1.1"]


async def test_no_proxy_naming_the_server_posts_directly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A proxy in the environment, and ``NO_PROXY`` naming the server's host: the
    harness posts straight to the server, and the proxy is never asked."""
    with trio.fail_after(20):
        async with raw_server() as (proxy, proxy_url), raw_server() as (server, base):
            monkeypatch.setenv("HTTP_PROXY", proxy_url)
            monkeypatch.setenv("NO_PROXY", "example.invalid,127.0.0.1")
            async with open_sender(base) as sender:
                settled = await Reporter(sender, base, TOKEN).complete(RUN, PATH, PAYLOAD)
    assert settled.kind == "delivered"
    assert server.request_lines == [f"POST {PATH} HTTP/1.1"]
    assert proxy.request_lines == []


async def test_no_proxy_alone_posts_directly() -> None:
    """``NO_PROXY`` without a proxy changes nothing: the harness posts directly."""
    with trio.fail_after(20):
        async with raw_server() as (server, base):
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv("NO_PROXY", "*")
                async with open_sender(base) as sender:
                    settled = await Reporter(sender, base, TOKEN).complete(RUN, PATH, PAYLOAD)
    assert settled.kind == "delivered"
    assert server.request_lines == [f"POST {PATH} HTTP/1.1"]


# --- the reporter's guarantees, over the harness's sender ----------------------------------------


@pytest.mark.protocol("§7")
async def test_a_redirect_is_an_answer_not_followed(autojump_clock: Any) -> None:
    with trio.fail_after(60):
        app = ScriptedApp((307, {"Location": "/steal"}, b""), (200, {}, b""))
        async with reporter_over(app) as reporter:
            result = await reporter.complete(RUN, PATH, PAYLOAD)
    assert (result.kind, result.status) == ("rejected", 307)
    assert [s.path for s in app.seen] == [PATH]


@pytest.mark.protocol("§7")
async def test_an_error_keeps_a_bounded_snippet_and_retry_after_is_honoured(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with trio.fail_after(60):
        app = ScriptedApp((429, {"Retry-After": "7"}, b"slow down " * 10_000), (200, {}, b""))
        with caplog.at_level(logging.WARNING, logger="prohost.reporter"):
            async with reporter_over(app) as reporter:
                result = await reporter.complete(RUN, PATH, PAYLOAD)
    assert result.kind == "delivered"
    assert gaps(app.times) == [7.0]
    [line] = [r.getMessage() for r in caplog.records if "429" in r.getMessage()]
    snippet = line.split("429: ", 1)[1].split(";", 1)[0]
    assert snippet.startswith("slow down") and len(snippet) == SNIPPET_CHARS


@pytest.mark.protocol("§1", "§7")
async def test_the_token_echoed_back_is_never_logged(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with trio.fail_after(60):
        app = ScriptedApp((401, {}, f"bad token {TOKEN}".encode()))
        with caplog.at_level(logging.DEBUG):
            async with reporter_over(app) as reporter:
                result = await reporter.complete(RUN, PATH, PAYLOAD)
    assert result.kind == "rejected" and "bad token" in result.detail
    assert TOKEN not in result.detail
    assert TOKEN not in caplog.text


@pytest.mark.protocol("§7")
async def test_transport_failures_read_as_before(autojump_clock: Any) -> None:
    """Refused, hanging, and a bad URL: the same settlements and one-line details."""
    with trio.fail_after(200):
        port = free_port()
        async with open_sender(f"http://127.0.0.1:{port}") as sender:
            refused = await Reporter(sender, f"http://127.0.0.1:{port}", TOKEN,
                                     window_s=5, rng=FixedRandom()).complete(RUN, PATH, PAYLOAD)
            bad = await Reporter(sender, "ftp://127.0.0.1", TOKEN).complete(RUN, PATH, PAYLOAD)
        app = ScriptedApp(HANG, (200, {}, b""))
        async with reporter_over(app, rng=FixedRandom()) as reporter:
            start = trio.current_time()
            hung = await reporter.complete(RUN, PATH, PAYLOAD)
            took = trio.current_time() - start
    assert (refused.kind, refused.status) == ("gave_up", None)
    assert "ConnectError" in refused.detail
    assert bad.kind == "rejected" and bad.detail.startswith("bad URL: ")
    assert hung.kind == "delivered"
    assert took == pytest.approx(31)  # the 30 s budget, then the first 1 s backoff


async def test_posts_share_one_kept_alive_connection() -> None:
    """Each POST's answer (completions, a 409, a timeline post) is read to its end,
    so the connection is kept: a run no longer pays for a new TCP connection (and
    the server for a new socket), over the transport as over a client."""
    clients: list[tuple[str, int]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        await read_body(receive)
        clients.append(tuple(scope["client"]))
        status = 409 if scope["path"].endswith("/again/complete") else 200
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"x" * (DRAIN_BYTES // 2)})

    with trio.fail_after(20):
        async with reporter_over(app) as reporter:
            for run_id in ("run_a", "run_b", "again"):
                await reporter.complete(run_id, f"/v1/agent/runs/{run_id}/complete", PAYLOAD)
            assert await reporter.post_timeline("run_a", "/v1/agent/runs/run_a/timeline", [])
    assert len(clients) == 4
    assert len(set(clients)) == 1, clients


@pytest.mark.protocol("§7")
@pytest.mark.parametrize("answer", ["endless", "gzip-bomb"])
async def test_a_hostile_answer_is_read_only_to_a_bound(answer: str) -> None:
    """256 MiB of answer, or 50 MiB of zeroes gzipped into less than DRAIN_BYTES: the
    report is delivered and the harness never holds more than a few MiB."""
    bomb = gzip.compress(b"\0" * (50 * 1024 * 1024), compresslevel=9)
    assert len(bomb) < DRAIN_BYTES

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        await read_body(receive)
        if answer == "gzip-bomb":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-encoding", b"gzip")]})
            await send({"type": "http.response.body", "body": bomb})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(4096):
            await send({"type": "http.response.body", "body": b"x" * 65536, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    with trio.fail_after(30):
        async with reporter_over(app) as reporter:
            result = await completed_holding_little(reporter)
    assert (result.kind, result.status) == ("delivered", 200)
