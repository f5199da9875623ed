"""Reports the server cannot take for longer than their window (docs/protocol.md §7), and
reports that hold their lane though their run never executed (§4), end to end.

The real harness, the reference server on loopback (its fault hooks: ``storm``
answers the next completion POSTs 503, ``hold_completions`` leaves a run's POSTs
unanswered until released), fake agents driven over a socket (tests/agents/gated.py),
a real sqlite ledger. The retry window is set to 0 (one attempt, then the outbox)
and the outbox's timer to never, so that nothing here waits on a clock: the outbox
is driven by reconnects, and its timer is tested on trio's virtual clock in
tests/engine/report/test_outbox.py. The 7-day limit is read on an injected wall clock.
"""

from __future__ import annotations

import io
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import trio
from rich.console import Console

from prohost.commands.status import status_command
from prohost.engine.harness import Harness
from prohost.engine.ledger import Ledger, RunState
from prohost.engine.report.outbox import ReportTiming
from prohost.options import Options
from prohost.server import ServerHandle
from prohost.wire.protocol import Heartbeat
from prohost.wire.runs import Outcome
from tests.kits.harness import (
    Gate,
    Running,
    endpoints_for,
    finished,
    messages,
    pair_home,
    running_server,
    start_run,
)
from tests.kits.status import status_says

pytestmark = pytest.mark.protocol("§7")

#: One attempt in the window, then the outbox; its timer never fires by itself.
ONE_TRY = ReportTiming(window_s=0, retry_every_s=math.inf)
DAY_S = 86400.0


@asynccontextmanager
async def harness_with_timing(
    tmp_path: Path, timing: ReportTiming, *,
    ledger_setup: Callable[[Ledger, ServerHandle], None] | None = None,
) -> AsyncIterator[tuple[Gate, Running]]:
    """A reference server, and a connected harness with ``timing`` whose agents are
    the test's :class:`Gate`; ``ledger_setup`` writes what a previous process left."""
    gate = Gate()
    home = tmp_path / "home"
    async with trio.open_nursery() as outer:
        await outer.start(gate.serve)
        async with running_server() as server:
            creds = pair_home(server, home)
            ledger = Ledger.open(home / "ledger.sqlite3")
            if ledger_setup is not None:
                ledger_setup(ledger, server)
            exit_code: list[int] = []
            exited = trio.Event()
            try:
                async with httpx.AsyncHTTPTransport() as client, trio.open_nursery() as nursery:
                    harness = Harness(
                        Options(home=home, machine="test", exec_command=gate.command),
                        endpoints_for(creds), client=client, ledger=ledger, timing=timing)

                    async def run_it(*, task_status: trio.TaskStatus[None]) -> None:
                        exit_code.append(await harness.run(task_status=task_status))
                        exited.set()

                    await nursery.start(run_it)
                    await server.wait_until(lambda s: s.connected > 0)
                    yield gate, Running(harness, server, creds, ledger, nursery.cancel_scope,
                                        exit_code, exited)
                    nursery.cancel_scope.cancel()
            finally:
                ledger.close()
        outer.cancel_scope.cancel()


def statuses(server: ServerHandle, run_id: str) -> list[int]:
    """Every completion POST the server got for ``run_id``, by the status it answered."""
    return [post.status for post in server.run(run_id).posts]


def waiting(harness: Harness) -> int:
    assert harness.runner is not None
    return len(harness.runner.outbox)


async def reconnect(server: ServerHandle) -> int:
    """Drop the harness's connection and wait for the next one; returns how many
    heartbeats the server had before, so the new connection's can be told apart."""
    before = len(messages(server.state, Heartbeat))
    connects = server.state.total_connects
    await server.drop_connections()
    await server.wait_until(lambda s: s.total_connects > connects and s.connected > 0)
    return before


async def test_a_report_outliving_its_window_lets_the_conversation_go_on_and_is_posted_on_reconnect(
    tmp_path: Path,
) -> None:
    """The server refuses the first turn's report for longer than its window: the
    conversation's next turn runs and reports meanwhile; the first turn stays
    `reporting` in heartbeats and in `agent status`, is not posted again while the
    outage lasts, and is posted once the server takes it (at a reconnect)."""
    with trio.fail_after(60):
        async with harness_with_timing(tmp_path, ONE_TRY) as (gate, running):
            server, harness = running.server, running.harness
            first = await start_run(server, gate, "first turn", conversation_id="C")
            second = await server.submit_run("second turn", conversation_id="C")
            await server.wait_until(lambda s: s.runs[second].state == "accepted")
            server.storm(503, count=1)  # the outage, as long as the first report's window
            finished_before = time.time()
            await gate.release(first, "one")
            # The first report did not settle, and its lane went on to the next turn.
            await gate.wait_started(second)
            await gate.release(second, "two")
            await server.wait_until(finished(second))
            assert server.run(second).completion["reply"] == "two"
            assert server.run(first).completion is None
            assert statuses(server, first) == [503]

            # `agent status` says one report waits, since the first turn finished.
            await status_says(tmp_path / "home", lambda seen: seen.reports_waiting == 1)
            out = io.StringIO()
            status_command(tmp_path / "home", as_json=True,
                           console=Console(file=out, width=200))
            document = json.loads(out.getvalue())
            assert document["reports_waiting"] == 1
            assert finished_before <= document["reports_waiting_since"] <= time.time()
            out = io.StringIO()
            status_command(tmp_path / "home", as_json=False,
                           console=Console(file=out, width=200))
            assert "1 report waits for the server (the oldest run finished" in out.getvalue()

            # A reconnect while the outage lasts: one more try, still refused; the
            # new connection's first heartbeat lists the run as still reporting.
            server.storm(503, count=1)
            before = await reconnect(server)
            await server.wait_until(lambda s: len(s.runs[first].posts) == 2)
            await server.wait_until(lambda s: len(messages(s, Heartbeat)) > before)
            beat = messages(server.state, Heartbeat)[before]
            assert {"run_id": first, "state": "reporting"} in [
                {"run_id": r.run_id, "state": r.state} for r in beat.runs]
            assert waiting(harness) == 1

            # The outage is over: the next reconnect posts it, exactly once.
            await reconnect(server)
            await server.wait_until(finished(first))
            await harness.wait_until(lambda h: waiting(h) == 0)
            assert server.run(first).completion["reply"] == "one"
            assert statuses(server, first) == [503, 503, 200]
            assert harness.snapshot().reports_waiting == 0
        assert running.ledger is not None
        with Ledger.open(tmp_path / "home" / "ledger.sqlite3") as after:
            row = after.get(first)
            assert row is not None and row.state is RunState.REPORTED


async def test_a_waiting_report_7_days_old_is_dropped_with_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A report still waiting 7 days after its run finished is not posted again:
    it is logged as an error naming the run, and closed in the ledger."""
    now = [time.time()]
    timing = ReportTiming(window_s=0, retry_every_s=math.inf, clock=lambda: now[0])
    with trio.fail_after(60):
        async with harness_with_timing(tmp_path, timing) as (gate, running):
            server, harness = running.server, running.harness
            run_id = await start_run(server, gate, "lost in the outage", conversation_id="C")
            server.storm(503, count=1)
            await gate.release(run_id, "late")
            await harness.wait_until(lambda h: waiting(h) == 1 and not h.held)
            now[0] += 7 * DAY_S
            with caplog.at_level(logging.ERROR, logger="prohost.runner"):
                await reconnect(server)
                await harness.wait_until(lambda h: waiting(h) == 0)
            assert statuses(server, run_id) == [503]
            assert server.run(run_id).completion is None
            assert any(record.levelno == logging.ERROR and run_id in record.getMessage()
                       and "dropping it" in record.getMessage() for record in caplog.records)
        with Ledger.open(tmp_path / "home" / "ledger.sqlite3") as after:
            row = after.get(run_id)
            assert row is not None and row.state is RunState.REPORTED
            assert row.settlement is not None and row.settlement.startswith("dropped")


def left_finished(ledger: Ledger, server: ServerHandle, conversation: str, reply: str,
                  age_s: float) -> str:
    """A run the previous process finished ``age_s`` ago and had not reported."""
    run_id = server.state.add_run(f"finished before the restart: {reply}", conversation).run_id
    at = time.time() - age_s
    ledger.admit(run_id, f"conv:{conversation}", server.run(run_id).body_text, at)
    ledger.mark_started(run_id, at)
    ledger.mark_finished(run_id, Outcome(ok=True, reply=reply).to_json(), at)
    return run_id


async def test_an_outcome_older_than_7_days_found_at_start_is_dropped_not_posted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """At start, a `finished` row whose run finished 8 days ago is not posted: the
    report is dropped with an error naming the run (§7); a fresh one is posted."""
    ids: dict[str, str] = {}

    def setup(ledger: Ledger, server: ServerHandle) -> None:
        ids["old"] = left_finished(ledger, server, "O", "old", 8 * DAY_S)
        ids["fresh"] = left_finished(ledger, server, "F", "fresh", 60.0)

    with trio.fail_after(60), caplog.at_level(logging.ERROR, logger="prohost.runner"):
        async with harness_with_timing(tmp_path, ONE_TRY, ledger_setup=setup) as (_, running):
            server = running.server
            await server.wait_until(finished(ids["fresh"]))
            await running.harness.wait_until(lambda h: not h.held)
            assert statuses(server, ids["old"]) == []
            assert server.run(ids["old"]).completion is None
            assert server.run(ids["fresh"]).completion["reply"] == "fresh"
            assert running.ledger is not None
            old = running.ledger.get(ids["old"])
    assert old is not None and old.state is RunState.REPORTED
    assert old.settlement is not None and old.settlement.startswith("dropped")
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(ids["old"] in line and "dropping it" in line for line in errors)
    assert not any(ids["fresh"] in line for line in errors)


@pytest.mark.protocol("§4", "§6")
async def test_a_cancelled_queued_run_holds_its_lane_until_its_report_settles(
    tmp_path: Path,
) -> None:
    """Conversation C: a running turn, a queued one that is cancelled, a later one.
    The cancelled turn's report goes after the running turn's, and the later turn
    neither starts nor reports until it has settled (§4), however slow the server
    is to take it."""
    with trio.fail_after(60):
        async with harness_with_timing(tmp_path, ReportTiming()) as (gate, running):
            server, harness = running.server, running.harness
            first = await start_run(server, gate, "running", conversation_id="C")
            cancelled = await server.submit_run("to be cancelled", conversation_id="C")
            later = await server.submit_run("later", conversation_id="C")
            await server.wait_until(
                lambda s: all(s.runs[r].state == "accepted" for r in (cancelled, later)))
            server.hold_completions(cancelled)
            await server.cancel_run(cancelled, "not needed")
            await harness.wait_until(lambda h: cancelled in h.held
                                     and h.held[cancelled].state == "reporting")
            await gate.release(first, "one")
            # The cancelled turn's report reaches the server (held there) only
            # after the running turn's report settled.
            await server.wait_until(lambda s: s.faults.held_posts.get(cancelled) == 1)
            assert server.run(first).completion is not None
            assert later not in gate.started
            assert harness.scheduler.statistics().queued == 1
            server.hold_completions(cancelled, held=False)
            await gate.wait_started(later)
            completion = server.run(cancelled).completion
            assert completion is not None
            assert completion["error"] == "cancelled: not needed"
            await gate.release(later, "three")
            await server.wait_until(finished(later))


@pytest.mark.protocol("§4")
async def test_a_recovered_outcome_holds_its_lane_until_its_report_settles(
    tmp_path: Path,
) -> None:
    """At start: a run the previous process finished but had not reported, and a
    later turn of its conversation accepted before the restart. The later turn does
    not start until the recovered report has settled (§4)."""
    ids: dict[str, str] = {}

    def setup(ledger: Ledger, server: ServerHandle) -> None:
        ids["prior"] = left_finished(ledger, server, "R", "before", 60.0)
        ids["later"] = server.state.add_run("accepted before the restart", "R").run_id
        ledger.admit(ids["later"], "conv:R", server.run(ids["later"]).body_text, time.time())
        server.hold_completions(ids["prior"])

    with trio.fail_after(60):
        async with harness_with_timing(tmp_path, ReportTiming(), ledger_setup=setup) as (
            gate, running
        ):
            server, harness = running.server, running.harness
            prior, later = ids["prior"], ids["later"]
            await server.wait_until(lambda s: s.faults.held_posts.get(prior) == 1)
            assert later not in gate.started
            assert harness.scheduler.statistics().queued == 1
            server.hold_completions(prior, held=False)
            await gate.wait_started(later)
            assert server.run(prior).completion["reply"] == "before"
            await gate.release(later, "after")
            await server.wait_until(finished(later))


@pytest.mark.protocol("§9")
async def test_a_drain_does_not_wait_for_a_report_the_server_will_not_take(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A drain with a report waiting in the outbox: the harness exits 0 (the outcome
    is safe in the ledger, `finished`, for the next start; §9), and says how many
    reports wait."""
    with trio.fail_after(60):
        async with harness_with_timing(tmp_path, ONE_TRY) as (gate, running):
            server, harness = running.server, running.harness
            run_id = await start_run(server, gate, "outage", conversation_id="C")
            server.storm(503, count=1)
            await gate.release(run_id, "kept")
            await harness.wait_until(lambda h: waiting(h) == 1 and not h.held)
            harness.drain()
            assert await running.wait_exit() == 0
            assert statuses(server, run_id) == [503]
            assert "1 report(s) wait in the ledger's outbox for the server" in caplog.text
            assert running.ledger is not None
            row = running.ledger.get(run_id)
            assert row is not None and row.state is RunState.FINISHED
