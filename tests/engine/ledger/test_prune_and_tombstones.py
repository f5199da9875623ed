"""Exactly once survives the prune (issue 8, reproduction 7; docs/protocol.md §3, §7).

Reported runs keep their body and outcome 7 days, then a tombstone (run id, state,
when reported) until 30 days after the report. A real sqlite file, the clock passed
in as ``now``; and through the real harness, a redelivery of a pruned run.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from prohost.engine.ledger import Admitted, Ledger, RunState
from prohost.engine.retention import KEEP_RUNS_S, KEEP_TOMBSTONES_S
from prohost.wire.runs import Outcome
from tests.kits.harness import (
    acks,
    delivery_frame,
    released,
    running_harness,
    running_server,
    wait_for_ack,
)
from tests.kits.paths import logs_folder

pytestmark = pytest.mark.protocol("§7")

DAY = 86400.0


def test_the_windows_are_seven_and_thirty_days() -> None:
    assert KEEP_RUNS_S == 7 * DAY
    assert KEEP_TOMBSTONES_S == 30 * DAY


@pytest.mark.protocol("§3")
def test_a_pruned_run_keeps_a_tombstone_that_still_refuses_it(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    reported_at = 1000 * DAY
    with Ledger.open(path) as ledger:
        ledger.admit("run-1", "conv:C1", '{"text": "private words"}', now=reported_at - 60)
        ledger.mark_started("run-1", now=reported_at - 50)
        ledger.mark_finished("run-1", Outcome(ok=True, reply="secret reply").to_json(),
                             now=reported_at - 10)
        ledger.mark_reported("run-1", "delivered: 200", now=reported_at)

        # Day 6: nothing changes yet.
        assert ledger.prune(now=reported_at + 6 * DAY) == 0
        row = ledger.get("run-1")
        assert row is not None and row.body and row.outcome

        # Day 8: the body and outcome are gone; the tombstone refuses a redelivery.
        assert ledger.prune(now=reported_at + 8 * DAY) == 1
        row = ledger.get("run-1")
        assert row is not None
        assert (row.state, row.reported_at) == (RunState.REPORTED, reported_at)
        assert (row.body, row.lane, row.outcome, row.settlement) == ("", "", None, None)
        assert ledger.admit("run-1", "conv:C1", "{}", now=reported_at + 8 * DAY) \
            is Admitted.REPORTED

    with Ledger.open(path) as ledger:
        # Day 29: still there after a restart; day 31: forgotten.
        assert ledger.prune(now=reported_at + 29 * DAY) == 0
        assert ledger.admit("run-1", "c", "{}", now=reported_at + 29 * DAY) is Admitted.REPORTED
        assert ledger.prune(now=reported_at + 31 * DAY) == 1
        assert ledger.get("run-1") is None


def test_unreported_runs_are_never_pruned_however_old(tmp_path: Path) -> None:
    with Ledger.open(tmp_path / "ledger.sqlite3") as ledger:
        ledger.admit("queued", "l", "{}", now=0.0)
        ledger.admit("running", "l", "{}", now=0.0)
        ledger.mark_started("running", now=0.0)
        ledger.admit("outbox", "l", "{}", now=0.0)
        ledger.mark_finished("outbox", Outcome(ok=True, reply="r").to_json(), now=0.0)
        assert ledger.prune(now=1000 * DAY) == 0
        for run_id in ("queued", "running", "outbox"):
            row = ledger.get(run_id)
            assert row is not None and row.body == "{}"


@pytest.mark.protocol("§3")
async def test_a_redelivery_of_a_pruned_run_is_204_and_never_runs(tmp_path: Path) -> None:
    """Through the real harness and server: run once, prune 8 days on, redeliver."""
    count = logs_folder(tmp_path) / "runs.txt"
    # Every execution leaves a line, so a second one cannot go unnoticed.
    command = f"sh -c 'echo run >> {count}; echo done'"
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=command,
        ) as running:
            run_id = await server.submit_run("once")
            await server.wait_until(lambda s: s.runs[run_id].state == "completed")
            await released(running.harness, run_id)
            assert running.ledger is not None
            assert running.ledger.prune(now=time.time() + 8 * DAY) == 1
            row = running.ledger.get(run_id)
            assert row is not None and row.body == ""

            secret = next(iter(server.state.harnesses.values())).secret
            await server.send_raw(delivery_frame(secret, server.run(run_id).body_text,
                                                 delivery_id="dlv_again"))
            ack = await wait_for_ack(server, "dlv_again")
            assert (ack.status, ack.reason) == (204, "already reported")
            assert not running.harness.held
            assert len([a for a in acks(server.state) if a.status == 200]) == 1
    assert count.read_text().splitlines() == ["run"]
