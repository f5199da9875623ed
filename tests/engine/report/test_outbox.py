"""The outbox's own clock (docs/protocol.md §7): a report that outlived its window is
posted again every 5 minutes until it settles, exactly once, on trio's virtual clock.

A real :class:`Reporter` posts to a scripted ASGI app served by hypercorn on
loopback, and the outbox reads and closes a real sqlite ledger. The ledger steps
run on the trio thread here (``SyncSteps``): under ``autojump_clock`` a worker
thread's wait would let the clock jump over the step's own bound. The whole
harness, with its worker threads, is tests/engine/report/test_outbox_in_runs.py.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import attrs
import httpx
import pytest
import trio
from rich.console import Console

from prohost.engine.ledger import Ledger, RunState
from prohost.engine.ledger.steps import LedgerSteps
from prohost.engine.report.outbox import RETRY_EVERY_S, Outbox
from prohost.engine.report.reporter import REQUEST_TIMEOUT_S, Reporter
from prohost.engine.view.panel import describe_change, render
from prohost.engine.view.snapshot import Snapshot
from prohost.wire.runs import Outcome
from tests.kits.asgi import lifespan, read_body, serving

pytestmark = pytest.mark.protocol("§7")

T = TypeVar("T")
TOKEN = "tok_outbox_test"


class SyncSteps(LedgerSteps):
    """The ledger's steps, called on the trio thread (see the module docstring)."""

    async def _read(self, fn: Callable[..., T], *args: object, what: str) -> T:
        return fn(*args)

    async def _write(self, fn: Callable[..., T], *args: object, what: str) -> T:
        return fn(*args)


class OutageApp:
    """Completions answered 503 while ``down``, 200 after; ``hang`` answers nothing."""

    def __init__(self) -> None:
        self.down = True
        self.hang = False
        self.seen: list[tuple[float, str, int]] = []  # (trio time, run id, status)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        run_id = json.loads(await read_body(receive))["run_id"]
        status = 503 if self.down else 200
        self.seen.append((trio.current_time(), run_id, 0 if self.hang else status))
        if self.hang:
            await trio.sleep_forever()
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def finished_run(ledger: Ledger, run_id: str) -> str:
    """A run whose outcome is ``finished`` in the ledger; returns its completion path."""
    path = f"/v1/agent/runs/{run_id}/complete"
    body = json.dumps({"run_id": run_id, "completion_path": path, "text": "t"})
    ledger.admit(run_id, f"run:{run_id}", body, 1.0)
    ledger.mark_started(run_id, 2.0)
    ledger.mark_finished(run_id, Outcome(ok=True, reply=f"reply of {run_id}").to_json(), 3.0)
    return path


@asynccontextmanager
async def outbox_for(app: OutageApp, tmp_path: Path) -> AsyncIterator[tuple[Outbox, Ledger]]:
    with Ledger.open(tmp_path / "ledger.sqlite3") as ledger:
        async with serving(app) as base, httpx.AsyncHTTPTransport() as client, \
                trio.open_nursery() as nursery:
            outbox = Outbox(Reporter(client, base, TOKEN), SyncSteps(ledger))
            await nursery.start(outbox.run)
            yield outbox, ledger
            nursery.cancel_scope.cancel()


async def test_a_waiting_report_is_posted_every_5_minutes_until_it_settles_once(
    autojump_clock: Any, tmp_path: Path
) -> None:
    app = OutageApp()
    with trio.fail_after(10 * 3600):
        async with outbox_for(app, tmp_path) as (outbox, ledger):
            path = finished_run(ledger, "run_w")
            start = trio.current_time()
            outbox.add("run_w", path, finished_at=time.time())
            await trio.sleep(3 * RETRY_EVERY_S + 1)
            # Three tries, 5 minutes apart, none sooner: the server is still down.
            assert [round(at - start) for at, _, _ in app.seen] == [300, 600, 900]
            row = ledger.get("run_w")
            assert row is not None and row.state is RunState.FINISHED
            assert len(outbox) == 1
            app.down = False  # the outage ends
            await trio.sleep(RETRY_EVERY_S)
            assert [status for _, _, status in app.seen] == [503, 503, 503, 200]
            assert len(outbox) == 0
            row = ledger.get("run_w")
            assert row is not None and row.state is RunState.REPORTED
            # Settled: never posted again.
            await trio.sleep(10 * RETRY_EVERY_S)
            assert len(app.seen) == 4


async def test_a_poke_posts_at_once_and_an_unreachable_server_is_asked_once_per_turn(
    autojump_clock: Any, tmp_path: Path
) -> None:
    """A poke (a reconnect) tries every waiting report now; when the server does not
    answer at all, the other reports wait for the next turn instead of each
    spending its own request timeout on it."""
    app = OutageApp()
    app.hang = True
    with trio.fail_after(10 * 3600):
        async with outbox_for(app, tmp_path) as (outbox, ledger):
            for run_id in ("run_a", "run_b"):
                outbox.add(run_id, finished_run(ledger, run_id), finished_at=time.time())
            start = trio.current_time()
            outbox.poke()
            await trio.sleep(REQUEST_TIMEOUT_S + 1)
            assert [(round(at - start), run_id) for at, run_id, _ in app.seen] == [(0, "run_a")]
            # Both wait a whole turn from when the server failed to answer.
            await trio.sleep(RETRY_EVERY_S + REQUEST_TIMEOUT_S)
            assert [(round(at - start), run_id) for at, run_id, _ in app.seen] == \
                [(0, "run_a"), (330, "run_a")]
            app.hang = False
            app.down = False
            outbox.poke()
            await trio.sleep(1)
            assert sorted(run_id for _, run_id, status in app.seen if status == 200) == \
                ["run_a", "run_b"]
            assert len(outbox) == 0


def test_the_panel_says_how_many_reports_wait_and_since_when() -> None:
    """The live panel (and so `agent status`) and the plain log say it; nothing is
    said while none waits."""
    quiet = Snapshot(taken_at=10_000.0, pid=1, version="0", connection="connected",
                     server="ws://example.test/ws", machine="m", brain="claude", slots=1,
                     slots_used=0, queued=0)
    waiting = attrs.evolve(quiet, reports_waiting=2,
                           reports_waiting_since=10_000.0 - 3 * 3600)

    def picture(snapshot: Snapshot) -> str:
        console = Console(file=io.StringIO(), width=100, record=True, color_system=None)
        console.print(render(snapshot))
        return console.export_text()

    assert "2 reports wait for the server (the oldest run finished 3 hours ago)" \
        in picture(waiting)
    assert "wait for the server" not in picture(quiet)
    assert "reports waiting for the server: 2" in describe_change(quiet, waiting)
