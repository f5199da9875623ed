"""Today's spend per account (runs, tokens, cost) from each run's §7 ``usage``, as
``agent status`` and the panel show it; counted again from the ledger at a restart."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console

from prohost.engine.accounts.book import AccountBook
from prohost.engine.accounts.spend import DailySpend, SpendRow, day_start
from prohost.engine.ledger import Ledger
from prohost.engine.ledger.steps import LedgerSteps
from prohost.engine.run.queued_bodies import QueuedBodies
from prohost.engine.supervisor.held import HeldRuns
from prohost.engine.supervisor.recovery import Recovery
from prohost.engine.supervisor.runqueue import RunQueue
from prohost.engine.view.panel import render
from prohost.engine.view.snapshot import FinishedRow, Snapshot
from prohost.wire.runs import Outcome
from prohost.wire.usage import Usage
from tests.kits.lanes import SettleLog

NOON = day_start(time.time()) + 12 * 3600
WORK = {"input_tokens": 1000, "output_tokens": 200, "cost_usd": 0.25}


def test_each_account_and_all_together() -> None:
    spend = DailySpend()
    assert spend.rows(NOON) == []
    spend.add("work", WORK, NOON)
    spend.add("work", {"input_tokens": 10, "cost_usd": float("nan")}, NOON + 1)
    spend.add("home", {"output_tokens": 5}, NOON + 2)  # Codex: no cost
    spend.add("home", None, NOON + 3)  # a failed run that said nothing
    assert spend.rows(NOON + 4) == [
        SpendRow("work", runs=2, input_tokens=1010, output_tokens=200, cost_usd=0.25),
        SpendRow("home", runs=2, input_tokens=0, output_tokens=5, cost_usd=None),
        SpendRow(None, runs=4, input_tokens=1010, output_tokens=205, cost_usd=0.25),
    ]


def test_the_tally_starts_again_at_local_midnight() -> None:
    spend = DailySpend()
    spend.add("work", WORK, NOON)
    tomorrow = NOON + 24 * 3600
    assert spend.rows(tomorrow) == []
    spend.add("work", {"input_tokens": 1}, tomorrow)
    spend.add("work", WORK, NOON)  # late news of yesterday: not today's
    assert spend.rows(tomorrow)[0] == SpendRow("work", runs=1, input_tokens=1)


async def test_a_restart_counts_todays_runs_again_from_the_ledger(tmp_path: Path) -> None:
    with Ledger.open(tmp_path / "ledger.sqlite3") as ledger:
        for run_id, finished_at, outcome in [
            ("today", NOON - 60, Outcome(ok=True, reply="r", account="work",
                                         usage=Usage.from_json(WORK))),
            ("failed", NOON - 30, Outcome.failure("x", account="work",
                                                  usage=Usage(input_tokens=7))),
            ("yesterday", NOON - 86400, Outcome(ok=True, account="work",
                                                usage=Usage.from_json(WORK))),
            ("not-run", NOON - 10, Outcome.failure("cancelled")),  # no agent ran
        ]:
            ledger.admit(run_id, run_id, "{}", finished_at - 5)
            ledger.mark_started(run_id, finished_at - 4)
            ledger.mark_finished(run_id, outcome.to_json(), finished_at)
            ledger.mark_reported(run_id, "posted", finished_at + 1)

        spend = DailySpend()
        scheduler = SettleLog()
        queue = RunQueue(scheduler, QueuedBodies(), lambda: None)
        recovery = Recovery(steps=LedgerSteps(ledger), runs=HeldRuns(lambda: None),
                            queue=queue, book=AccountBook(),
                            clock=lambda: NOON, spend=spend)
        await recovery.recover()
    assert scheduler.settled == []  # every row was reported
    assert spend.rows(NOON)[0] == SpendRow("work", runs=2, input_tokens=1007,
                                           output_tokens=200, cost_usd=0.25)


def test_the_panel_and_status_show_the_spend_and_what_each_run_did() -> None:
    snapshot = Snapshot(
        taken_at=NOON, pid=1, version="1", connection="connected", server="ws://h",
        machine="m", brain="claude", slots=4, slots_used=0, queued=0,
        finished=(FinishedRow(run_id="run_1", conversation="C42", ok=True, error=None,
                              duration_s=12.0, finished_at=NOON - 5,
                              changes="3 files (+12 −2), 1 commit", tokens=12_300,
                              cost_usd=0.0412),),
        spend_today=(SpendRow("work", runs=3, input_tokens=12_000, output_tokens=300,
                              cost_usd=0.42),
                     SpendRow("home", runs=1, input_tokens=2000, output_tokens=0),
                     SpendRow(None, runs=4, input_tokens=14_000, output_tokens=300,
                              cost_usd=0.42)))
    console = Console(width=140, record=True, color_system=None)
    console.print(render(snapshot))
    text = console.export_text()
    assert ("today  work 3 runs 12.3k tokens $0.4200 · home 1 run 2.0k tokens · "
            "all 4 runs 14.3k tokens $0.4200") in text
    assert "3 files (+12 −2), 1 commit · 12.3k tokens · $0.0412" in text
    assert Snapshot.from_json(snapshot.to_json()) == snapshot  # status.json keeps it
