"""A saved outcome the restart cannot read back (issue 27, point 7).

A ``finished`` row's outcome is text in the ledger: written by another version, or
damaged, it may not be JSON or not an outcome. Before, reading it raised out of
recovery, so the harness failed at every start and no run of the ledger was ever
reported again. Now that run is reported retryable as an internal error and the
others are recovered as usual.

Real parts throughout: the reference server on 127.0.0.1, the production harness,
a real sqlite ledger file left as a previous process would, and a plain agent
subprocess for the run that is queued again.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import httpx
import pytest
import trio

from prohost.engine.harness import Harness
from prohost.engine.ledger import Ledger, RunState, UnreportedRuns
from prohost.engine.report.outbox import ReportTiming
from prohost.options import Options
from prohost.server import ServerHandle
from prohost.wire.outcomes import RESTARTED, UNREADABLE_OUTCOME
from prohost.wire.runs import Outcome, parse_body
from tests.kits.harness import (
    agent_command,
    endpoints_for,
    finished,
    pair_home,
    released,
    running_harness,
    running_server,
)

pytestmark = pytest.mark.protocol("§7")

#: How the server receives the damaged run's report.
UNREADABLE = {"ok": False, "error": "internal error: the saved outcome could not be read",
              "retryable": True}


def leave_finished(ledger: Ledger, server: ServerHandle, run_id: str, outcome: str) -> None:
    """``run_id`` as a previous process left it: finished, ``outcome`` saved, not
    reported."""
    body = server.run(run_id).body_text
    now = time.time()
    ledger.admit(run_id, parse_body(body).lane, body, now)
    ledger.mark_started(run_id, now)
    ledger.mark_finished(run_id, outcome, now)


@pytest.mark.parametrize("saved", ['{"ok": tru', '{"ok": "perhaps", "reply": 3}'],
                         ids=["not JSON", "not an outcome"])
async def test_an_unreadable_saved_outcome_is_reported_and_the_rest_recovered(
    tmp_path: Path, saved: str,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    with trio.fail_after(60):
        async with running_server() as server:
            runs = {name: server.state.add_run(name, f"C-{name}").run_id
                    for name in ("damaged", "saved", "interrupted", "queued")}
            now = time.time()
            with Ledger.open(home / "ledger.sqlite3") as ledger:
                for run_id in runs.values():
                    body = server.run(run_id).body_text
                    ledger.admit(run_id, parse_body(body).lane, body, now)
                for name in ("damaged", "saved", "interrupted"):
                    ledger.mark_started(runs[name], now)
                ledger.mark_finished(runs["damaged"], saved, now)
                ledger.mark_finished(runs["saved"], Outcome(ok=True, reply="the saved answer")
                                     .to_json(), now)

            async with running_harness(
                server, home, exec_command=agent_command("reply.py", "ran now"),
            ) as running:
                await server.wait_until(finished(*runs.values()))
                for run_id in runs.values():
                    await released(running.harness, run_id)
                ledger = running.ledger
                assert ledger is not None
                assert ledger.recover() == UnreportedRuns(pending=[], interrupted=[], outbox=[])
                for run_id in runs.values():
                    row = ledger.get(run_id)
                    assert row is not None and row.state is RunState.REPORTED

            assert server.run(runs["damaged"]).completion == {
                "run_id": runs["damaged"], **UNREADABLE}
            # A run interrupted by the restart says how long it ran (§7).
            interrupted = dict(server.run(runs["interrupted"]).completion or {})
            assert isinstance(interrupted.pop("duration_ms"), int)
            assert interrupted == {
                "run_id": runs["interrupted"], "ok": False, "error": RESTARTED,
                "retryable": True}
            for name, reply in [("saved", "the saved answer"), ("queued", "ran now")]:
                completion = server.run(runs[name]).completion
                assert completion is not None and completion.get("reply") == reply, name


async def test_an_unreadable_saved_outcome_waiting_in_the_outbox_is_reported(
    tmp_path: Path,
) -> None:
    """The restart's report of the damaged run outlives its window (one try, answered
    503), so the outbox reads the saved outcome again at its next try (a reconnect):
    there too it is reported, not raised out of the harness."""
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with running_server() as server:
            creds = pair_home(server, home)
            run_id = server.state.add_run("damaged", "C").run_id
            with Ledger.open(home / "ledger.sqlite3") as ledger:
                leave_finished(ledger, server, run_id, '{"ok": tru')
            server.storm(503, count=1)  # the restart's one try at it
            with Ledger.open(home / "ledger.sqlite3") as ledger:
                async with httpx.AsyncHTTPTransport() as client, trio.open_nursery() as nursery:
                    # One try in the window, then the outbox; its timer never fires.
                    harness = Harness(
                        Options(home=home, machine="test", exec_command="false"),
                        endpoints_for(creds), client=client, ledger=ledger,
                        timing=ReportTiming(window_s=0, retry_every_s=math.inf))
                    nursery.start_soon(harness.run)
                    await server.wait_until(lambda s: len(s.runs[run_id].posts) == 1)
                    assert server.run(run_id).completion is None
                    assert harness.runner is not None
                    await harness.wait_until(lambda h: run_id in h.runner.outbox)
                    # A new connection pokes the outbox: its try posts the run now.
                    await server.wait_until(lambda s: s.connected > 0)
                    await server.drop_connections()
                    await server.wait_until(finished(run_id))
                    await harness.wait_until(lambda h: run_id not in h.runner.outbox)
                    nursery.cancel_scope.cancel()
                # Read once the harness is gone: the outbox lets a run go before its
                # `reported` step, which the harness's exit waits for.
                row = ledger.get(run_id)
                assert row is not None and row.state is RunState.REPORTED
            assert [post.status for post in server.run(run_id).posts] == [503, 200]
            assert server.run(run_id).completion == {"run_id": run_id, **UNREADABLE}
            assert UNREADABLE["error"] == UNREADABLE_OUTCOME
