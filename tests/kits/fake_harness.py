"""A fake harness for the reference server's tests: a trio-websocket client that
authenticates as a paired harness and speaks the wire by hand (§2–§3), and the HTTP
completion it would post (§7).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from trio_websocket import WebSocketConnection, open_websocket_url

from prohost.server import ServerHandle

#: The largest message the fake harness takes.
BIG = 8 * 1024 * 1024


def auth(creds: dict[str, str], machine: str = "m1") -> list[tuple[bytes, bytes]]:
    """The handshake headers of a harness paired as ``creds`` (§1)."""
    return [
        (b"Authorization", f"Bearer {creds['token']}".encode()),
        (b"X-Prohost-Machine", machine.encode()),
        (b"X-Prohost-Agent", b"prohost-python/test"),
    ]


@asynccontextmanager
async def harness(creds: dict[str, str], machine: str = "m1") -> AsyncIterator[WebSocketConnection]:
    """A connected fake harness; the server's ``hello`` has been read already."""
    async with open_websocket_url(
        creds["ws_url"], extra_headers=auth(creds, machine), max_message_size=BIG
    ) as ws:
        hello = json.loads(await ws.get_message())
        assert hello["type"] == "hello"
        yield ws


async def next_of(ws: WebSocketConnection, kind: str) -> dict[str, Any]:
    """The next message of type ``kind``, skipping the others (pings mostly)."""
    while True:
        message: dict[str, Any] = json.loads(await ws.get_message())
        if message["type"] == kind:
            return message


async def send(ws: WebSocketConnection, **message: Any) -> None:
    """Send ``message`` as one JSON text frame."""
    await ws.send_message(json.dumps(message))


async def ack(
    ws: WebSocketConnection, delivery: dict[str, Any], status: int = 200, reason: str = ""
) -> None:
    """Ack ``delivery`` with ``status`` (§3)."""
    await send(ws, type="ack", id=delivery["id"], status=status,
               reason=reason or f"status {status}")


async def complete(
    server: ServerHandle,
    creds: dict[str, str] | None,
    run_id: str,
    payload: Any = None,
    *,
    content: bytes | None = None,
) -> httpx.Response:
    """POST a completion for ``run_id`` as the harness would (§7), with the token of
    ``creds`` (none: unauthenticated); by default an ok one replying "done"."""
    headers = {"Idempotency-Key": run_id}
    if creds is not None:
        headers["Authorization"] = f"Bearer {creds['token']}"
    if payload is None and content is None:
        payload = {"run_id": run_id, "ok": True, "reply": "done"}
    async with httpx.AsyncClient(base_url=server.http_url) as client:
        return await client.post(
            f"/v1/agent/runs/{run_id}/complete", json=payload, content=content, headers=headers
        )
