"""Scripted HTTP servers for the reporter's tests (docs/protocol.md §7, §8): an ASGI app
answering from a script and recording each request with the trio time it arrived, a
pinned jitter, a port nobody listens on, and a report made while the memory it holds
is measured.
"""

from __future__ import annotations

import itertools
import random
import socket
import tracemalloc
from typing import Any

import attrs
import trio

from prohost.engine.report.reporter import Reporter, Settlement
from tests.kits.asgi import lifespan, read_body

TOKEN = "tok_s3cret_do_not_log"
RUN = "run_01"
PATH = f"/v1/agent/runs/{RUN}/complete"
PAYLOAD: dict[str, Any] = {
    "run_id": RUN,
    "ok": True,
    "reply": "Fixed: the fixture path.",
    "usage": {"input_tokens": 12},
}

#: status, headers, body
Answer = tuple[int, dict[str, str], bytes]
HANG: Answer = (0, {}, b"")  # never answer: the client's timeout has to fire


@attrs.define
class Seen:
    """One request the app got, and the trio time it arrived."""

    at: float
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class ScriptedApp:
    """An ASGI callable answering from a script; the last answer repeats."""

    def __init__(self, *script: Answer) -> None:
        self.script = list(script)
        self.seen: list[Seen] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        body = await read_body(receive)
        self.seen.append(
            Seen(
                at=trio.current_time(),
                method=scope["method"],
                path=scope["path"],
                headers={k.decode().lower(): v.decode() for k, v in scope["headers"]},
                body=body,
            )
        )
        answer = self.script[min(len(self.seen), len(self.script)) - 1]
        if answer is HANG:
            await trio.sleep_forever()
        status, headers, content = answer
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(k.encode(), v.encode("latin-1")) for k, v in headers.items()],
            }
        )
        await send({"type": "http.response.body", "body": content})

    @property
    def times(self) -> list[float]:
        return [s.at for s in self.seen]


class FixedRandom(random.Random):
    """Jitter pinned to the top of its range, so backoff is exactly 1, 2, 4, ... 30 s."""

    def random(self) -> float:
        return 1.0


def free_port() -> int:
    """A port nobody listens on: bound, then closed."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def gaps(times: list[float]) -> list[float]:
    """The time between each two successive requests, to the millisecond."""
    return [round(b - a, 3) for a, b in itertools.pairwise(times)]


#: The report :func:`completed_holding_little` sends: not ASCII, and 5,000 characters long.
BOUNDED_RUN = "run_b1"
BOUNDED_PATH = f"/v1/agent/runs/{BOUNDED_RUN}/complete"
BOUNDED_PAYLOAD: dict[str, Any] = {"run_id": BOUNDED_RUN, "ok": True,
                                   "reply": "héllo ✓ " + "r" * 5000}


async def completed_holding_little(reporter: Reporter) -> Settlement:
    """Report once through ``reporter``; less than 8 MiB of memory may be held while
    the answer is read, whatever it is."""
    tracemalloc.start()
    try:
        result = await reporter.complete(BOUNDED_RUN, BOUNDED_PATH, BOUNDED_PAYLOAD)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024, f"{peak / 2**20:.1f} MiB held while reading the answer"
    return result
