"""The close code a harness sent, as the server's ASGI app sees it.

A harness that goes on purpose (``agent stop``, Ctrl-C: the end of a drain, §9)
closes its socket with a close frame and the normal code, 1000; one whose machine
or network dropped sends none. The app tells the two apart by the code of the
``websocket.disconnect`` event (:mod:`prohost.server.app`): only the second is
expected back (:mod:`prohost.server.seen`).

hypercorn (0.17, 0.18) reports every close made by the client as 1006, close
frame or none (pgjones/hypercorn#127): its stream answers the frame, then ends as
if the socket had been lost. :func:`report_client_close_codes` makes it report the
code the client sent instead: the stream notes the code of the close frame it
answers (the answer carries the client's code, RFC 6455 §5.5.1) and, when it
ends, tells the app that code. A hypercorn whose stream does not look as
expected is left as it is (every close then reads as a lost connection, the old
behaviour); the tests of a stopped harness say so.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger("prohost.server")

_PATCHED = "_prohost_reports_client_close_codes"


def report_client_close_codes() -> None:
    """Make hypercorn's WebSocket stream pass the client's close code to the app.
    Idempotent; logs (at debug) and does nothing when hypercorn differs."""
    try:
        from hypercorn.protocol import ws_stream
        from hypercorn.protocol.events import StreamClosed
        from wsproto.connection import ConnectionState
        from wsproto.events import CloseConnection
    except ImportError as exc:  # a hypercorn or wsproto laid out otherwise
        log.debug("cannot pass WebSocket close codes through hypercorn: %s", exc)
        return
    stream = getattr(ws_stream, "WSStream", None)
    if stream is None or getattr(stream, _PATCHED, False):
        return
    handle: Callable[[Any, Any], Awaitable[None]] | None = getattr(stream, "handle", None)
    send_event: Callable[[Any, Any], Awaitable[None]] | None = getattr(
        stream, "_send_wsproto_event", None)
    if handle is None or send_event is None:
        log.debug("cannot pass WebSocket close codes through hypercorn: its stream differs")
        return

    async def noting_send(self: Any, event: Any) -> None:
        connection = getattr(self, "connection", None)
        if (isinstance(event, CloseConnection) and connection is not None
                and connection.state is ConnectionState.REMOTE_CLOSING):
            # The answer to the client's close frame: the same code (RFC 6455).
            self._prohost_client_close_code = event.code
        await send_event(self, event)

    async def reporting_handle(self: Any, event: Any) -> None:
        code = getattr(self, "_prohost_client_close_code", None)
        put = getattr(self, "app_put", None)
        if (isinstance(event, StreamClosed) and code is not None and put is not None
                and not self.closed):
            self.closed = True
            await put({"type": "websocket.disconnect", "code": code})
            return
        await handle(self, event)

    stream.handle = reporting_handle
    stream._send_wsproto_event = noting_send
    setattr(stream, _PATCHED, True)
