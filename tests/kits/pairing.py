"""A pairing endpoint for tests (docs/protocol.md §10): an ASGI app answering every
request with a scripted status and answer, and recording what it was sent.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from tests.kits.asgi import lifespan, read_body

Asgi = Callable[[dict[str, Any], Callable[[], Awaitable[dict[str, Any]]],
                 Callable[[dict[str, Any]], Awaitable[None]]], Awaitable[None]]


def pair_app(status: int, answer: object, seen: list[dict[str, Any]]) -> Asgi:
    """An app answering every request with ``status`` and ``answer`` (JSON, or the
    bytes as they are), recording each request in ``seen``."""
    async def app(
        scope: dict[str, Any],
        receive: Callable[[], Awaitable[dict[str, Any]]],
        send: Callable[[dict[str, Any]], Awaitable[None]],
    ) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        body = await read_body(receive)
        seen.append(
            {
                "method": scope["method"],
                "path": scope["path"],
                "headers": {k.decode(): v.decode() for k, v in scope["headers"]},
                "json": json.loads(body),
            }
        )
        payload = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    return app


def ws_url(http_base: str) -> str:
    """The agent socket URL a harness would be given for a server at ``http_base``."""
    return "ws" + http_base.removeprefix("http") + "/v1/agent/ws"


#: What a server answers a good pairing.
GOOD_ANSWER = {
    "token": "tok-SECRET-1",
    "secret": "sec-SECRET-2",
    "ws_url": "ws://127.0.0.1:1/v1/agent/ws",
    "api_url": "http://127.0.0.1:1",
    "account": "acme",
}
