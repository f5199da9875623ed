"""The WebSocket link to the server (docs/protocol.md §1–§2).

The link dials out, says who it is, and then keeps one rule above all others: the
reader never waits on a run. It reads a frame, hands it to the harness (which
classifies and writes the ledger, quickly), sends the answer the harness returns
(the ack), and reads the next one, so pings are answered and acks go out however
busy the machine is.

When anything goes wrong — refused, reset, a handshake that takes over 30 s, a
server that goes quiet for three heartbeat periods, an oversized message — the
connection is dropped and dialled again after a full-jitter exponential backoff.
The one failure that is not retried is the server saying the credentials are
wrong (401/403 at the upgrade): retrying cannot fix that, and a daemon spinning on
it would fill a log nobody reads. :class:`CredentialsRejected` ends the harness.
"""

from __future__ import annotations

import contextlib
import logging
import random
import socket
import ssl
from collections.abc import Callable
from typing import Protocol
from urllib.parse import urlsplit

import attrs
import trio
import trio_websocket
from wsproto.utilities import LocalProtocolError

from prohost import AGENT_HEADER_VALUE
from prohost.errors import leaves
from prohost.invocation import command
from prohost.wire import protocol
from prohost.wire.protocol import Hello, Message, Ping, Unknown

log = logging.getLogger("prohost.link")

#: The handshake (TCP + TLS + upgrade) must finish within this (§1).
HANDSHAKE_TIMEOUT_S = 30.0
#: Backoff: delay = random(0, min(cap, base × 2^attempt)) (§1).
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 30.0
#: Silence longer than this many heartbeat periods means the link is dead (§2).
LIVENESS_PERIODS = 3
#: How long a local close may take before the socket is simply dropped.
CLOSE_TIMEOUT_S = 2.0
#: The close code of a harness that goes on purpose (RFC 6455: normal closure).
NORMAL_CLOSURE = 1000

#: Where the server's agent socket is (§1); named when an upgrade is answered 404.
WS_PATH = "/v1/agent/ws"

#: Failures of one connection attempt that are answered by reconnecting.
_RECOVERABLE = (
    OSError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    trio.TooSlowError,
    trio_websocket.HandshakeError,
    trio_websocket.ConnectionClosed,
    # trio-websocket can leak this from wsproto after a local close.
    LocalProtocolError,
    ssl.SSLError,
)


@attrs.frozen
class Endpoints:
    """Where the server is and who this machine is to it (from the credentials)."""

    ws_url: str
    api_base: str
    token: str
    #: Signs deliveries (§3); never sent, never logged.
    secret: str

    def headers(self, machine: str) -> list[tuple[bytes, bytes]]:
        """The upgrade request's headers (§1)."""
        return [
            (b"Authorization", f"Bearer {self.token}".encode()),
            (b"X-Prohost-Machine", machine.encode()),
            (b"X-Prohost-Agent", AGENT_HEADER_VALUE.encode()),
        ]


class CredentialsRejected(Exception):
    """The server refused the credentials at the handshake (401 or 403)."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status

    def __str__(self) -> str:
        return (
            f"the server rejected this machine's credentials (HTTP {self.status}); "
            f"pair again with `{command('agent', 'pair', '--code', 'CODE')}`"
        )


class Session:
    """One live, greeted connection. Sending on a closed one raises ConnectionClosed."""

    def __init__(self, ws: trio_websocket.WebSocketConnection, hello: Hello, number: int) -> None:
        self._ws = ws
        self.hello = hello
        self.heartbeat_s = hello.heartbeat_period()
        #: 1 for the first connection of the process, 2 for the next…
        self.number = number

    async def send(self, message: Message) -> None:
        """Send one message. Cancelling it may leave the frame half-written; the
        connection is then unusable and the link reconnects."""
        await self._ws.send_message(protocol.encode(message))


class LinkHandler(Protocol):
    async def on_session(
        self, session: Session, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Runs for as long as the connection lives; cancelled when it drops.

        Reports started once the connection's first messages are sent: until then
        the reader answers nothing (not even a ``ping``), so that ``status`` is
        always the first message on a connection (§1).
        """

    async def on_message(self, session: Session, message: Message) -> Message | None:
        """Every decoded message except ``hello`` and ``ping``, in arrival order;
        returns the answer the reader sends at once (a delivery's ack), if any. What
        is answered later is sent on ``session`` by whoever answers it.

        Cancelled when the connection drops; it must not raise for anything the
        server sends (§2).
        """


@attrs.frozen
class LinkStatistics:
    connected: bool
    url: str
    connects: int
    #: Connections lost, and attempts that failed, since the first connection was
    #: greeted; 0 until then, so whoever shows it says "connecting", never
    #: "reconnecting", to a harness that has never reached its server.
    failures: int
    reconnect_at: float | None
    last_error: str | None
    #: Whether any connection was ever greeted (``hello``) in this process.
    ever_connected: bool = False
    #: Every attempt that failed or ended, whether or not one ever succeeded.
    attempts_failed: int = 0


def enable_keepalive(sock: trio.socket.SocketType) -> None:
    """Ask the kernel to probe an idle connection (§2 SHOULD), where it can."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
            option = getattr(socket, name, None)
            if option is not None:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
    except OSError as exc:  # not fatal: application-level liveness still applies
        log.debug("could not enable TCP keepalive: %s", exc)


def backoff_delay(attempt: int, rng: random.Random) -> float:
    """Full jitter: uniform between 0 and the capped exponential (§1)."""
    ceiling = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** min(attempt, 32))
    return rng.uniform(0.0, ceiling)


class Link:
    """Dial, greet, read, and reconnect forever; see the module docstring."""

    def __init__(
        self,
        url: str,
        headers: list[tuple[bytes, bytes]],
        handler: LinkHandler,
        *,
        rng: random.Random | None = None,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.url = url
        self._headers = headers
        self._handler = handler
        self._rng = rng or random.Random()
        self._on_change = on_change
        self._attempt = 0
        self._connects = 0
        self._failures = 0
        self._attempts_failed = 0
        self._ever_connected = False
        self._connected = False
        self._reconnect_at: float | None = None
        self._last_error: str | None = None
        self._connects_greeted = 0
        self._liveness: trio.CancelScope | None = None
        self._heartbeat_s = protocol.HEARTBEAT_DEFAULT_S
        #: Set by :meth:`leave`: the next close is the harness going on purpose.
        self._leaving = False

    def leave(self) -> None:
        """Say that the harness goes on purpose (a drain or a stop has ended): when
        the link is cancelled next, the connection is closed with a close frame and
        the normal code (1000) instead of being dropped, so that the server does not
        take it for a lost connection and expect the harness back (§9)."""
        self._leaving = True

    def statistics(self) -> LinkStatistics:
        return LinkStatistics(
            connected=self._connected,
            url=self.url,
            connects=self._connects,
            failures=self._failures,
            reconnect_at=self._reconnect_at,
            last_error=self._last_error,
            ever_connected=self._ever_connected,
            attempts_failed=self._attempts_failed,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep a connection up until cancelled.

        Reports started at once: the harness works while the server is away.
        Raises :class:`CredentialsRejected` on a 401/403 handshake. On cancellation
        the current socket is closed (bounded, shielded) and the cancel propagates.
        """
        task_status.started()
        while True:
            greeted_before = self._connects_greeted
            error = await self._connect_once()
            self._connected = False
            self._attempts_failed += 1
            if self._ever_connected:
                self._failures += 1
            self._last_error = error
            delay = backoff_delay(self._attempt, self._rng)
            self._attempt += 1
            self._reconnect_at = trio.current_time() + delay
            self._on_change()
            # "lost" only for a connection that was up: a harness that never got
            # through must not read as one that had a server and lost it.
            if self._connects_greeted > greeted_before:
                log.warning("connection to %s lost (%s); reconnecting in %.1f s",
                            self.url, error, delay)
            elif self._ever_connected:
                log.warning("could not reconnect to %s (%s); trying again in %.1f s",
                            self.url, error, delay)
            else:
                log.warning("could not connect to %s (%s); trying again in %.1f s",
                            self.url, error, delay)
            await trio.sleep(delay)
            self._reconnect_at = None

    async def _connect_once(self) -> str:
        """One connection's whole life. Returns why it ended."""
        try:
            async with trio.open_nursery() as nursery:
                reason = await self._connection(nursery)
                nursery.cancel_scope.cancel()
                return reason
        except BaseExceptionGroup as group:
            matched, rest = group.split(_RECOVERABLE)
            if rest is not None or matched is None:
                # (matched is None only with rest set: split() keeps every leaf.)
                raise group if rest is None else rest from None
            found = leaves(matched)
            # A rejection explains the rest (the reader's error and our cancelled wait).
            found.sort(key=lambda exc: not isinstance(exc, trio_websocket.ConnectionRejected))
            return self._describe(found[0])
        except _RECOVERABLE as exc:
            return self._describe(exc)

    def _describe(self, exc: BaseException) -> str:
        if isinstance(exc, trio_websocket.ConnectionRejected):
            if exc.status_code in (401, 403):
                raise CredentialsRejected(exc.status_code) from None
            if exc.status_code == 404:
                # The natural mistake: the server's address without the socket's path.
                if urlsplit(self.url).path.rstrip("/") != WS_PATH:
                    return f"the server answered 404 at {self.url}: is the path {WS_PATH}?"
                return f"the server answered 404 at {self.url}: it has no agent socket there"
            return f"the server refused the upgrade with HTTP {exc.status_code}"
        if isinstance(exc, trio_websocket.ConnectionClosed):
            reason = exc.reason
            return f"closed ({reason.code} {reason.name})" if reason else "closed"
        if isinstance(exc, trio.TooSlowError):
            return "handshake took longer than 30 s"
        cause = exc.__cause__ or exc.__context__
        text = str(exc) or type(exc).__name__
        # trio wraps a TLS failure as BrokenResourceError: the SSLError says what failed.
        if isinstance(exc, trio_websocket.HandshakeError | trio.BrokenResourceError) and (
            cause is not None
        ):
            text = str(cause) or type(cause).__name__
        return text

    async def _connection(self, nursery: trio.Nursery) -> str:
        with trio.fail_after(HANDSHAKE_TIMEOUT_S):
            ws = await self._dial(nursery)
        self._connects += 1
        # A server that has gone quiet will not answer a close frame either:
        # then the socket is simply dropped instead of waiting for it. A link
        # cancelled from outside drops it too, unless the harness leaves on purpose.
        close_timeout = 0.0
        silent = False
        try:
            with trio.CancelScope() as liveness:
                self._liveness = liveness
                self._heard()
                reason = await self._read(ws, nursery)
                close_timeout = CLOSE_TIMEOUT_S
                return reason
            silent = True
            return (
                f"nothing heard from the server for {LIVENESS_PERIODS} × "
                f"{self._heartbeat_s:g} s"
            )
        finally:
            self._liveness = None
            if self._connected:
                self._connected = False
                self._on_change()
            if self._leaving and not silent:
                # Going on purpose: a close frame (1000), which the server answers
                # at once; bounded all the same (§9's stop window).
                close_timeout = CLOSE_TIMEOUT_S
            # Cancelled mid-close, trio-websocket still closes the stream itself.
            with trio.move_on_after(close_timeout, shield=True):
                with contextlib.suppress(*_RECOVERABLE):
                    await ws.aclose(NORMAL_CLOSURE)

    def _heard(self) -> None:
        if self._liveness is not None:
            self._liveness.deadline = (
                trio.current_time() + LIVENESS_PERIODS * self._heartbeat_s
            )

    async def _dial(self, nursery: trio.Nursery) -> trio_websocket.WebSocketConnection:
        parts = urlsplit(self.url)
        secure = parts.scheme == "wss"
        host = parts.hostname or "localhost"
        port = parts.port or (443 if secure else 80)
        resource = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        tcp = await trio.open_tcp_stream(host, port)
        stream: trio.SocketStream | trio.SSLStream[trio.SocketStream] = tcp
        try:
            enable_keepalive(tcp.socket)
            if secure:
                stream = trio.SSLStream(
                    tcp, ssl.create_default_context(), server_hostname=host,
                    https_compatible=True,
                )
                await stream.do_handshake()
            host_header = host if port in (80, 443) else f"{host}:{port}"
            return await trio_websocket.wrap_client_stream(
                nursery,
                stream,
                host_header,
                resource,
                extra_headers=self._headers,
                # Drained promptly by _read; a little room keeps trio-websocket's reader
                # (which answers WebSocket pings) from stalling behind us.
                message_queue_size=64,
                max_message_size=protocol.MAX_MESSAGE_BYTES,
            )
        except BaseException:
            # A failed TLS handshake or upgrade (or the 30 s limit) must close the TCP
            # connection now, not whenever the garbage collector finds the socket.
            # aclose_forcefully cancels its own close: bounded, and safe in a cancel.
            await trio.aclose_forcefully(stream)
            raise

    async def _read(self, ws: trio_websocket.WebSocketConnection, nursery: trio.Nursery) -> str:
        session: Session | None = None
        while True:
            raw = await ws.get_message()
            self._heard()
            size = len(raw)
            # A character is at most 4 UTF-8 bytes: only a long text needs encoding
            # to know its size, and the reader stays off that work for the rest.
            # (What the socket hands over is decoded UTF-8: it holds no lone
            # surrogate, and "replace" would count one as the 3 bytes it takes.)
            if isinstance(raw, str) and 4 * size > protocol.MAX_MESSAGE_BYTES:
                size = len(raw.encode("utf-8", "replace"))
            if size > protocol.MAX_MESSAGE_BYTES:
                await ws.aclose(1009, "message over 4 MiB")
                return f"the server sent a {size}-byte message (limit 4 MiB)"
            try:
                session = await self._handle(ws, raw, session, nursery)
            except Exception as exc:
                if _is_recoverable(exc):
                    raise  # the connection failed: reconnect
                # Every input the server can send is handled above on purpose; this
                # is a bug, and one bug must not take down the harness and its runs.
                log.exception(
                    "a message from the server could not be handled (a bug: please "
                    "report it); the message is dropped and the connection kept"
                )

    async def _handle(
        self,
        ws: trio_websocket.WebSocketConnection,
        raw: str | bytes,
        session: Session | None,
        nursery: trio.Nursery,
    ) -> Session | None:
        """Decode one message and act on it; returns the connection's session."""
        try:
            message = protocol.decode(raw)
        except protocol.DecodeError as exc:
            log.warning("dropped a malformed message from the server: %s", _short(str(exc)))
            return session
        if isinstance(message, Hello):
            self._heartbeat_s = message.heartbeat_period()
            self._heard()
            if session is None:
                self._attempt = 0
                self._connected = True
                self._ever_connected = True
                self._connects_greeted += 1
                session = Session(ws, message, self._connects)
                log.info("connected to %s", self.url)
                self._on_change()
                # Waits for status (and the first heartbeat) to go out before any
                # pong or ack can: status is the first message on a connection (§1).
                await nursery.start(self._handler.on_session, session)
            else:
                session.heartbeat_s = self._heartbeat_s
            return session
        if isinstance(message, Ping):
            await ws.send_message(protocol.encode_pong(message))
            return session
        if isinstance(message, Unknown):
            log.debug("ignored a message of unknown type %r", _short(message.type))
            return session
        if session is None:
            log.warning("ignored a %s message sent before hello", type(message).TYPE)
            return session
        answer = await self._handler.on_message(session, message)
        if answer is not None:
            # Sent here, after the handler returned (the ack after its ledger
            # write, §3), and before the next frame is read.
            await session.send(answer)
        return session


def _is_recoverable(exc: BaseException) -> bool:
    """Whether ``exc`` (or every exception in it, for a group) means the connection
    failed, which the link answers by reconnecting."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(_RECOVERABLE)[1] is None
    return isinstance(exc, _RECOVERABLE)


def _short(text: str, limit: int = 200) -> str:
    """Wire text for a log line: cut short (a message can be megabytes long)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
