"""A tiny test-local HTTP server: an ASGI callable served by hypercorn on loopback.

For tests that need a server answering exactly what the test scripts (pairing
answers, completion statuses) rather than the reference server's behaviour.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import hypercorn.trio
import trio
from hypercorn.config import Config

from prohost.server.asgi import answer_lifespan as lifespan

__all__ = ["lifespan", "read_body", "serving"]

Receive = Callable[[], Awaitable[dict[str, Any]]]


async def read_body(receive: Receive) -> bytes:
    """The whole request body."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


@asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:  # hypercorn's ASGI types are exact TypedDicts
    """Serve ``app`` on 127.0.0.1 port 0 until the block ends; yields its http:// base URL."""
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.graceful_timeout = 1.0
    config.errorlog = None  # keep "Running on ..." out of captured output
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            partial(hypercorn.trio.serve, app, config, shutdown_trigger=shutdown.wait)
        )
        try:
            yield binds[0]
        finally:
            shutdown.set()
