"""The reference server's listening socket, which the restart fault can close and
open again on the same port while the server's state lives on.

hypercorn serves one "generation" per listening socket. The socket is made here
rather than by hypercorn so that it is closed the moment its generation ends:
hypercorn leaves its own sockets to the garbage collector, and a listening socket
still open would make the same port unavailable for the next generation.
"""

from __future__ import annotations

import errno
import logging
import socket
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import hypercorn.config
import trio
from hypercorn.config import Sockets
from hypercorn.trio.run import worker_serve
from hypercorn.utils import wrap_app

from prohost.server.faults import drop_all
from prohost.server.wsclose import report_client_close_codes
from prohost.wire.protocol import MAX_MESSAGE_BYTES

if TYPE_CHECKING:
    from prohost.server.state import ServerState

log = logging.getLogger("prohost.server")

#: hypercorn's own messages ("Running on …") stay quiet unless something goes wrong.
_hypercorn_log = logging.getLogger("prohost.server.hypercorn")
if _hypercorn_log.level == logging.NOTSET:
    _hypercorn_log.setLevel(logging.WARNING)

#: WebSocket close code sent to harnesses when the server shuts down (going away).
GOING_AWAY = 1001
#: Pending connections the kernel queues before the server accepts them (count).
BACKLOG = 128
#: After a restart, how long to keep trying to bind the same port again (seconds),
#: and how long between tries; the port is ours unless another program took it.
REBIND_FOR_S = 10.0
REBIND_EVERY_S = 0.1
#: How long hypercorn lets open HTTP requests finish when a generation ends (seconds).
GRACEFUL_S = 2.0


def _hypercorn_config() -> hypercorn.config.Config:
    hc = hypercorn.config.Config()
    hc.accesslog = None
    hc.errorlog = _hypercorn_log
    hc.websocket_max_message_size = MAX_MESSAGE_BYTES
    hc.graceful_timeout = GRACEFUL_S
    return hc


def _listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``port`` 0: any free one)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.setblocking(False)
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


async def _listen_again(host: str, port: int) -> socket.socket:
    """Bind ``port`` again after a restart, retrying while it is briefly in use."""
    with trio.move_on_after(REBIND_FOR_S):
        while True:
            try:
                return _listen(host, port)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
            await trio.sleep(REBIND_EVERY_S)
    raise OSError(
        errno.EADDRINUSE,
        f"the restart fault could not listen on {host}:{port} again for "
        f"{REBIND_FOR_S:g} s: another program holds the port",
    )


async def serve_generations(
    app: Any,
    state: ServerState,
    host: str,
    port: int,
    stop: trio.Event,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``host:port`` until ``stop`` is set, one hypercorn generation
    at a time: a restart request (``state.faults.restart_requested``) drops every
    harness socket, closes the listener, waits ``restart_down_s`` and listens on the
    same port again. ``task_status`` gets the first generation's bound URLs.

    Cancelled: the current generation is cancelled and its socket closed at once.
    """
    # A harness's close frame says it went on purpose: the app must see its code.
    report_client_close_codes()
    faults = state.faults
    sock = _listen(host, port)
    port = sock.getsockname()[1]
    first = True
    while True:
        restart = faults.restart_requested

        async def trigger(restart: trio.Event = restart) -> None:
            async with trio.open_nursery() as nursery:
                for event in (stop, restart):
                    nursery.start_soon(_wait_then_cancel, event, nursery.cancel_scope)
            if stop.is_set():
                state.close_connections(GOING_AWAY)
            else:
                drop_all(state, GOING_AWAY)

        try:
            async with trio.open_nursery() as nursery:
                binds = await nursery.start(
                    partial(
                        worker_serve,
                        cast(Any, wrap_app(app, 0, "asgi")),
                        _hypercorn_config(),
                        sockets=Sockets([], [sock], []),
                        shutdown_trigger=trigger,
                    )
                )
                if first:
                    task_status.started(binds)
                    first = False
        finally:
            sock.close()
        if stop.is_set():
            return
        faults.listening = False
        faults.restarts += 1
        faults.restart_requested = trio.Event()
        state.changed()
        log.warning("restart fault: not listening for %g s", faults.restart_down_s)
        with trio.move_on_after(faults.restart_down_s):
            await stop.wait()
        if stop.is_set():
            return
        sock = await _listen_again(host, port)
        faults.listening = True
        state.changed()
        log.warning("restart fault: listening again on port %d", port)


async def _wait_then_cancel(event: trio.Event, scope: trio.CancelScope) -> None:
    """Cancel ``scope`` once ``event`` is set. Cancelled: returns at once."""
    await event.wait()
    scope.cancel()
