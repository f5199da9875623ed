"""The ASGI plumbing under the reference server's routes: reading requests, writing answers.

Nothing here knows a route or the server's state: the ASGI types, a request's
headers, Bearer token and (bounded) JSON body, the error that carries an HTTP
status, a refused WebSocket upgrade with its exact status, and the lifespan
answer. :mod:`prohost.server.app` builds every route from these.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

#: Largest HTTP request body accepted (a reply may be up to 1 MiB plus a marker).
MAX_BODY_BYTES = 8 * 1024 * 1024


class Disconnected(Exception):
    """The HTTP client went away before its request body arrived."""


class HttpError(Exception):
    """A request the server refuses: answered with ``status`` and ``{"error": message}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def header(scope: Scope, name: bytes) -> str | None:
    """The request header ``name`` (lower case), or ``None`` when it was not sent."""
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def bearer(scope: Scope) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or ``None``."""
    value = header(scope, b"authorization")
    if value is None:
        return None
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def json_bytes(payload: Any) -> bytes:
    """``payload`` as an answer's body: one line of JSON, non-ASCII kept as UTF-8."""
    return json.dumps(payload, ensure_ascii=False).encode() + b"\n"


async def answer_lifespan(receive: Receive, send: Send) -> None:
    """Answer the server's lifespan startup and shutdown (nothing to set up).
    Cancelled: returns at once; there is nothing to undo."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def read_body(receive: Receive) -> bytes:
    """The whole request body, at most :data:`MAX_BODY_BYTES` (else a 413).

    Raises :class:`Disconnected` if the client leaves first. Cancelled: the
    body read so far is dropped.
    """
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Disconnected
        chunk = bytes(message.get("body", b""))
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise HttpError(413, f"request body over {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def json_or_none(raw: bytes) -> Any:
    """``raw`` parsed as JSON, or ``None`` when it is not JSON (for the record only)."""
    try:
        return json.loads(raw)
    except ValueError:
        return None


def parse_json(raw: bytes) -> Any:
    """``raw`` parsed as JSON; a 400 that says why when it is not."""
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise HttpError(400, f"the body is not JSON: {exc}") from None


async def read_json(receive: Receive) -> Any:
    """The request body parsed as JSON (see :func:`read_body` and :func:`parse_json`).
    Cancelled: as :func:`read_body`."""
    return parse_json(await read_body(receive))


async def reject(scope: Scope, send: Send, status: int, message: str) -> None:
    """Refuse a WebSocket upgrade with an exact HTTP status.
    Cancelled: the refusal may be cut short; the client then sees the socket close."""
    if "websocket.http.response" in scope.get("extensions", {}):
        body = json_bytes({"error": message})
        await send(
            {
                "type": "websocket.http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "websocket.http.response.body", "body": body})
    else:  # the server cannot say which status: ASGI makes this a 403
        await send({"type": "websocket.close", "code": 1008})
