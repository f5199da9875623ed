"""A lean HTTP/1.1 transport for the harness's ``httpx.AsyncClient``: h11 over trio
streams, connections kept alive and reused.

Why: the harness posts one completion per run from its one trio thread, and a POST
through httpx's default transport cost about 1.2–1.6 ms of CPU with the 16
connections that 16 busy runs keep (httpcore's pool scans every pooled connection
twice per request, with a ``poll`` on each and a quadratic count of the idle ones);
through this one, 0.45–0.67 ms (docs/benchmarks.md, "Fewer hops, a lean HTTP
transport"). Everything above the transport — the request, headers, event
hooks, redirects not followed, timeouts, the response and its errors — is still
httpx's. A client configured with environment proxies keeps httpx's own transport
(:func:`client_options`).

The wire is what httpcore would send: one request at a time per connection,
``Host`` and the other headers as httpx built them, the body as httpx encoded it;
a connection whose answer was read to its end is kept (at most
:data:`MAX_IDLE` of them, each for :data:`IDLE_EXPIRY_S`), any other is closed.
Errors are httpx's exceptions, named as httpcore names them (``ConnectError``,
``ReadTimeout``, ``RemoteProtocolError``, ...).
"""

from __future__ import annotations

import ssl
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import h11
import httpx
import trio

__all__ = ["LeanTransport", "client_options"]

#: Requests in flight at once (connections in use), as httpx's default limit.
MAX_CONNECTIONS = 100
#: Idle connections kept for reuse, as httpx's default limit.
MAX_IDLE = 20
#: An idle connection older than this (s) is closed rather than reused, as httpx's
#: default keep-alive expiry: servers close idle connections on their own clock.
IDLE_EXPIRY_S = 5.0
#: Bytes asked of the socket per read.
READ_BYTES = 64 * 1024

_Origin = tuple[str, str, int]


def client_options() -> dict[str, Any]:
    """Keyword arguments for the harness's ``httpx.AsyncClient``: this transport,
    unless the environment names a proxy (``HTTPS_PROXY`` and the like), which
    httpx's own transport honours and this one does not."""
    # The schemes httpx takes proxies for, from the same source (environment
    # variables, or the system's settings on macOS and Windows).
    proxies = urllib.request.getproxies()
    if any(proxies.get(scheme) for scheme in ("http", "https", "all")):
        return {}
    return {"transport": LeanTransport()}


class _Connection:
    """One kept-alive HTTP/1.1 connection; used by one request at a time."""

    __slots__ = ("h11", "idle_since", "stream")

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)
        self.idle_since = 0.0

    def reusable(self, now: float) -> bool:
        """Idle, young enough, and not closed by the server meanwhile (a closed
        socket reads as readable: its EOF is waiting)."""
        if now - self.idle_since > IDLE_EXPIRY_S:
            return False
        stream = self.stream
        if isinstance(stream, trio.SSLStream):
            stream = stream.transport_stream
        if not isinstance(stream, trio.SocketStream):
            return False
        return not stream.socket.is_readable()

    async def send(self, event: h11.Event, within_s: float | None) -> None:
        data = self.h11.send(event)
        if not data:
            return
        try:
            with trio.fail_after(_seconds(within_s)):
                await self.stream.send_all(data)
        except trio.TooSlowError:
            raise httpx.WriteTimeout("timed out while sending the request") from None
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise httpx.WriteError(str(exc) or type(exc).__name__) from exc

    async def next_event(self, within_s: float | None) -> h11.Event | type[h11.PAUSED]:
        while True:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as exc:
                raise httpx.RemoteProtocolError(str(exc)) from exc
            if event is not h11.NEED_DATA:
                return event  # type: ignore[return-value]  # h11's sentinels are types
            try:
                with trio.fail_after(_seconds(within_s)):
                    data = await self.stream.receive_some(READ_BYTES)
            except trio.TooSlowError:
                raise httpx.ReadTimeout("timed out while reading the response") from None
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise httpx.ReadError(str(exc) or type(exc).__name__) from exc
            if not data and self.h11.their_state is h11.SEND_RESPONSE:
                raise httpx.RemoteProtocolError(
                    "Server disconnected without sending a response.")
            self.h11.receive_data(bytes(data))


class LeanTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 over trio TCP (and TLS with httpx's default context), connections
    kept alive per origin. Use one per trio run."""

    def __init__(self, *, ssl_context: ssl.SSLContext | None = None) -> None:
        self._ssl_context = ssl_context
        self._idle: dict[_Origin, list[_Connection]] = {}
        self._slots = trio.Semaphore(MAX_CONNECTIONS)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` and return its response once the headers are in; the
        body streams from the connection, which goes back to the pool when the body
        was read to its end and the response closed.

        Cancelled: the connection is closed (its state is unknown) and the
        cancellation propagates.
        """
        url = request.url
        if url.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(
                f"Request URL has an unsupported protocol '{url.scheme}://'.")
        origin = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        timeouts = request.extensions.get("timeout", {})
        try:
            with trio.fail_after(_seconds(timeouts.get("pool"))):
                await self._slots.acquire()
        except trio.TooSlowError:
            raise httpx.PoolTimeout("timed out waiting for a connection") from None
        connection: _Connection | None = None
        try:
            connection = self._reuse(origin) or await self._connect(origin, timeouts)
            await connection.send(h11.Request(
                method=request.method, target=url.raw_path, headers=request.headers.raw,
            ), timeouts.get("write"))
            async for chunk in request.stream:  # type: ignore[union-attr]
                await connection.send(h11.Data(data=chunk), timeouts.get("write"))
            await connection.send(h11.EndOfMessage(), timeouts.get("write"))
            while True:
                event = await connection.next_event(timeouts.get("read"))
                if isinstance(event, h11.Response):
                    break
                if not isinstance(event, h11.InformationalResponse):
                    raise httpx.RemoteProtocolError(f"unexpected {type(event).__name__}")
        except BaseException:
            self._slots.release()
            if connection is not None:
                await _close(connection)
            raise
        return httpx.Response(
            status_code=event.status_code,
            headers=list(event.headers),
            stream=_Body(self, origin, connection, timeouts.get("read")),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": event.reason},
        )

    async def aclose(self) -> None:
        """Close every idle connection. Cancelled: they are closed all the same
        (forcefully, which never waits)."""
        idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection in connections:
                await _close(connection)

    def _reuse(self, origin: _Origin) -> _Connection | None:
        """The newest idle connection to ``origin`` still fit for a request; the
        unfit ones met on the way are dropped (closed at once: no I/O waits)."""
        connections = self._idle.get(origin)
        now = trio.current_time()
        while connections:
            connection = connections.pop()
            if connection.reusable(now):
                return connection
            _close_now(connection)
        return None

    async def _connect(self, origin: _Origin, timeouts: dict[str, float | None]) -> _Connection:
        scheme, host, port = origin
        try:
            with trio.fail_after(_seconds(timeouts.get("connect"))):
                stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
                if scheme == "https":
                    if self._ssl_context is None:
                        self._ssl_context = httpx.create_ssl_context()
                    tls = trio.SSLStream(stream, self._ssl_context, server_hostname=host,
                                         https_compatible=True)
                    try:
                        await tls.do_handshake()
                    except BaseException:
                        await trio.aclose_forcefully(stream)
                        raise
                    stream = tls
        except trio.TooSlowError:
            raise httpx.ConnectTimeout(f"timed out connecting to {host}:{port}") from None
        except (OSError, trio.BrokenResourceError, ssl.SSLError) as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc
        return _Connection(stream)

    def _give_back(self, origin: _Origin, connection: _Connection) -> None:
        """Keep ``connection`` for the next request if its exchange ended cleanly."""
        state = connection.h11
        if state.our_state is h11.DONE and state.their_state is h11.DONE:
            state.start_next_cycle()
            idle = self._idle.setdefault(origin, [])
            if len(idle) < MAX_IDLE:
                connection.idle_since = trio.current_time()
                idle.append(connection)
                return
        _close_now(connection)


class _Body(httpx.AsyncByteStream):
    """A response body read from its connection; closing it settles the connection."""

    def __init__(self, transport: LeanTransport, origin: _Origin, connection: _Connection,
                 timeout: float | None) -> None:
        self._transport = transport
        self._origin = origin
        self._connection: _Connection | None = connection
        self._timeout = timeout

    async def __aiter__(self) -> AsyncIterator[bytes]:
        connection = self._connection
        if connection is None:
            raise httpx.StreamClosed()
        while True:
            event = await connection.next_event(self._timeout)
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return
            else:
                raise httpx.RemoteProtocolError(f"unexpected {type(event).__name__}")

    async def aclose(self) -> None:
        """Give the connection back (kept when the body was read to its end, else
        closed). Cancelled: settled all the same; nothing here waits."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        self._transport._slots.release()
        self._transport._give_back(self._origin, connection)


def _seconds(timeout: float | None) -> float:
    return float("inf") if timeout is None else timeout


def _close_now(connection: _Connection) -> None:
    """Close without waiting: TLS's goodbye is skipped, as for any connection we
    drop (the server sees the TCP close)."""
    stream = connection.stream
    if isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    if isinstance(stream, trio.SocketStream):
        stream.socket.close()


async def _close(connection: _Connection) -> None:
    """Close ``connection`` at once (shielded: also while cancelled)."""
    with trio.CancelScope(shield=True):
        await trio.aclose_forcefully(connection.stream)
