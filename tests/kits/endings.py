"""How the endings tests cancel a run at the reference server and wait for the harness to
answer."""

from __future__ import annotations

from typing import Any

from prohost.wire.protocol import Pong
from tests.kits.harness import (
    messages,
)

CANCELLED = "cancelled: cancelled by the user"


async def cancel_run(server: Any, run_id: str) -> None:
    """Cancel ``run_id`` as a person would (``DELETE /v1/runs/<id>``, reason "cancelled
    by the user" is the server's own)."""
    server.state.cancel_run(server.run(run_id), "cancelled by the user")


async def handled(server: Any, ping_id: str) -> None:
    """Return once the harness has read every frame sent before now (the reader
    takes them in order: the ping after them is answered)."""
    await server.send_raw(f'{{"type": "ping", "id": "{ping_id}"}}')
    await server.wait_until(lambda s: any(p.id == ping_id for p in messages(s, Pong)))
