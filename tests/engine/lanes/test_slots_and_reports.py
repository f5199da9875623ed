"""A slot is for an agent, not for a report (docs/protocol.md §4, issue 11).

The production harness with ``--concurrency 1``, gated agents, and the reference
server for the WebSocket; completions go to a small ASGI app that answers a run's
first POST 503 and holds the retries until the test lets them through, so a run
can be kept "reporting" for as long as the test likes, without sleeping.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from prohost.engine.harness import Harness
from prohost.engine.ledger import Ledger, RunState
from prohost.engine.link.connection import Endpoints
from prohost.options import Options
from tests.kits.asgi import lifespan, read_body, serving
from tests.kits.harness import Gate, busy_and_queued, pair_home, running_server

pytestmark = pytest.mark.protocol("§4", "§7")


class FailingCompletions:
    """Completion endpoint: 503 to a run's first POST, then holds it until released."""

    def __init__(self) -> None:
        self.posts: dict[str, int] = {}
        self.delivered: list[str] = []
        self._open: dict[str, trio.Event] = {}
        self._changed = trio.Event()

    def release(self, run_id: str) -> None:
        self._open.setdefault(run_id, trio.Event()).set()

    async def wait(self, predicate: Any) -> None:
        while not predicate(self):
            await self._changed.wait()

    def _poke(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        run_id = json.loads(await read_body(receive))["run_id"]
        self.posts[run_id] = self.posts.get(run_id, 0) + 1
        self._poke()
        if self.posts[run_id] == 1:
            status, headers = 503, [(b"retry-after", b"0")]
        else:
            await self._open.setdefault(run_id, trio.Event()).wait()
            status, headers = 200, []
            self.delivered.append(run_id)
            self._poke()
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"{}"})


@asynccontextmanager
async def slot_harness(
    tmp_path: Path,
) -> AsyncIterator[tuple[Gate, FailingCompletions, Harness, Any]]:
    gate = Gate()
    completions = FailingCompletions()
    home = tmp_path / "home"
    async with trio.open_nursery() as nursery:
        await nursery.start(gate.serve)
        async with running_server() as server, serving(completions) as api_base:
            creds = pair_home(server, home)
            ledger = Ledger.open(home / "ledger.sqlite3")
            try:
                options = Options(home=home, machine="test", exec_command=gate.command,
                                  concurrency=1)
                endpoints = Endpoints(ws_url=creds.ws_url, api_base=api_base,
                                      token=creds.token, secret=creds.secret)
                async with httpx.AsyncHTTPTransport() as client, trio.open_nursery() as inner:
                    harness = Harness(options, endpoints, client=client, ledger=ledger)
                    await inner.start(harness.run)
                    await server.wait_until(lambda s: s.connected > 0)
                    yield gate, completions, harness, server
                    inner.cancel_scope.cancel()
            finally:
                ledger.close()
        nursery.cancel_scope.cancel()


async def test_a_run_being_reported_frees_its_slot_for_another_lane(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with slot_harness(tmp_path) as (gate, completions, harness, server):
            a, [b] = await busy_and_queued(server, gate, "B")
            await trio.testing.wait_all_tasks_blocked(0.05)
            assert gate.started == [a]  # one slot, and A's agent has it
            await gate.release(a)
            # A's agent ended and its completion fails: A is reporting, and B
            # starts in the slot A's agent gave back.
            await gate.wait_started(b)
            assert harness.held[a].state == "reporting"
            assert completions.posts[a] >= 1 and completions.delivered == []
            stats = harness.scheduler.statistics()
            assert (stats.limit, stats.running, stats.reporting) == (1, 1, 1)
            completions.release(a)
            await gate.release(b)
            completions.release(b)
            await completions.wait(lambda c: sorted(c.delivered) == sorted([a, b]))
            await harness.wait_until(lambda h: not h.held)
            assert harness.ledger is not None
            row = harness.ledger.get(a)
            assert row is not None and row.state is RunState.REPORTED


async def test_a_lanes_next_turn_waits_until_the_last_one_is_reported(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with slot_harness(tmp_path) as (gate, completions, harness, server):
            a, [a2] = await busy_and_queued(server, gate, "A")
            await gate.release(a)
            # A is reporting (its completion fails, then is held): the slot is
            # free, but A2 must not start before A's result is in.
            await completions.wait(lambda c: c.posts.get(a, 0) >= 2)
            await trio.testing.wait_all_tasks_blocked(0.05)
            assert gate.started == [a]
            stats = harness.scheduler.statistics()
            assert (stats.running, stats.reporting, stats.queued) == (0, 1, 1)
            completions.release(a)
            await gate.wait_started(a2)
            assert completions.delivered == [a]  # A reached the server before A2 began
            await gate.release(a2)
            completions.release(a2)
            await completions.wait(lambda c: c.delivered == [a, a2])
