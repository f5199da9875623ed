"""The harness's lean HTTP transport (prohost.engine.leanhttp) where it must decide on
its own: which connection a request may reuse, and when httpx's transport is kept.

Its behaviour under the reporter (retries, timeouts, redirects, errors, kept-alive
connections) is tests/test_reporter.py's, which runs every test on both transports.
The server here is a raw trio TCP listener on 127.0.0.1 port 0, so the test decides
exactly when a connection closes.
"""

from __future__ import annotations

import contextlib
from functools import partial
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from prohost.engine import leanhttp
from prohost.engine.leanhttp import LeanTransport

ANSWER = (b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nok")
BIG = 70_000  # bytes of a body the client leaves unread


class RawServer:
    """Answers each request on a connection with ``ANSWER`` (or a big body for
    ``/big``), then closes the connection when told to (``close_after``)."""

    def __init__(self, *, close_after: int | None = None) -> None:
        self.close_after = close_after
        self.connections = 0
        self.closed = trio.Event()

    async def handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        # A reset: the client dropped a connection whose answer it left unread.
        with contextlib.suppress(trio.BrokenResourceError):
            await self._answer(stream)

    async def _answer(self, stream: trio.SocketStream) -> None:
        answered = 0
        buffer = b""
        async with stream:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                if head.startswith(b"POST"):
                    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                      if line.lower().startswith(b"content-length")))
                    while len(buffer) < length:
                        buffer += await stream.receive_some(65536)
                    buffer = buffer[length:]
                if b" /big " in head.split(b"\r\n")[0]:
                    await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n"
                                          % BIG + b"x" * BIG)
                else:
                    await stream.send_all(ANSWER)
                answered += 1
                if answered == self.close_after:
                    break
        self.closed.set()


async def serve(nursery: trio.Nursery, server: RawServer) -> str:
    listeners = await nursery.start(partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    server = RawServer(close_after=1)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            base = await serve(nursery, server)
            async with httpx.AsyncClient(transport=LeanTransport()) as client:
                assert (await client.post(f"{base}/a", content=b"one")).text == "ok"
                await server.closed.wait()
                # Kept alive by the client, closed by the server meanwhile: the next
                # request goes on a new connection instead of failing on the old one.
                assert (await client.post(f"{base}/b", content=b"two")).text == "ok"
            assert server.connections == 2
            nursery.cancel_scope.cancel()


async def test_a_connection_is_reused_only_after_its_answer_was_read_to_the_end() -> None:
    server = RawServer()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            base = await serve(nursery, server)
            async with httpx.AsyncClient(transport=LeanTransport()) as client:
                await client.post(f"{base}/a", content=b"one")
                await client.post(f"{base}/b", content=b"two")
                assert server.connections == 1  # read to the end: kept
                async with client.stream("POST", f"{base}/big", content=b"x") as response:
                    assert response.status_code == 200  # closed with its body unread
                await client.post(f"{base}/c", content=b"three")
            assert server.connections == 2
            nursery.cancel_scope.cancel()


async def test_a_cancelled_request_gives_its_slot_back_and_drops_its_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(leanhttp, "MAX_CONNECTIONS", 1)
    hung = trio.Event()

    async def hang(stream: trio.SocketStream) -> None:
        hung.set()
        await trio.sleep_forever()

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(partial(trio.serve_tcp, hang, 0, host="127.0.0.1"))
            port = listeners[0].socket.getsockname()[1]
            server = RawServer()
            base = await serve(nursery, server)
            async with httpx.AsyncClient(transport=LeanTransport()) as client:
                with trio.CancelScope() as scope:
                    async def cancel_when_hung() -> None:
                        await hung.wait()
                        await trio.testing.wait_all_tasks_blocked()
                        scope.cancel()

                    nursery.start_soon(cancel_when_hung)
                    await client.post(f"http://127.0.0.1:{port}/x", content=b"x")
                assert scope.cancelled_caught
                # The one slot is free again: this request does not wait for it.
                assert (await client.post(f"{base}/a", content=b"one")).text == "ok"
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("variable", ["HTTPS_PROXY", "http_proxy", "ALL_PROXY"])
def test_a_proxy_in_the_environment_keeps_httpx_transport(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy",
                 "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert isinstance(leanhttp.client_options()["transport"], LeanTransport)
    monkeypatch.setenv(variable, "http://proxy.invalid:3128")
    # httpx routes through the proxy only with its own transport.
    assert leanhttp.client_options() == {}


def test_unsupported_schemes_are_httpx_errors() -> None:
    async def main() -> Any:
        async with httpx.AsyncClient(transport=LeanTransport()) as client:
            await client.post("ftp://127.0.0.1/x", content=b"x")

    with pytest.raises(httpx.UnsupportedProtocol):
        trio.run(main)
