"""One owner for every retention period and its schedule (prohost.engine.retention):
the harness's daily pass clears the ledger's old reported runs and the stderr tails
past their period, and keeps everything younger, through a real ledger file and real
files."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from prohost.engine.agent.stderrtail import read_tail, tail_path, write_tail
from prohost.engine.blocking import Bounds
from prohost.engine.ledger import Ledger
from prohost.engine.ledger.steps import LedgerSteps
from prohost.engine.retention import DAY_S, KEEP_RUNS_S
from prohost.engine.supervisor.upkeep import DailyPass
from prohost.wire.runs import Outcome

pytestmark = pytest.mark.protocol("§7")


def reported(ledger: Ledger, run_id: str, at: float) -> None:
    ledger.admit(run_id, "conv:C", '{"text": "words"}', now=at - 3)
    ledger.mark_started(run_id, now=at - 2)
    ledger.mark_finished(run_id, Outcome(ok=True, reply="r").to_json(), now=at - 1)
    ledger.mark_reported(run_id, "delivered: 200", now=at)


async def test_the_daily_pass_clears_the_ledger_and_the_tails_past_their_period(
    tmp_path: Path,
) -> None:
    now = time.time()
    home = tmp_path / "home"
    home.mkdir()
    with Ledger.open(tmp_path / "ledger.sqlite3") as ledger:
        reported(ledger, "old", now - KEEP_RUNS_S - DAY_S)
        reported(ledger, "recent", now - DAY_S)
        write_tail(home, "old", b"old stderr\n")
        write_tail(home, "recent", b"recent stderr\n")
        aged = now - KEEP_RUNS_S - DAY_S
        os.utime(tail_path(home, "old"), (aged, aged))

        await DailyPass(home, Bounds(), LedgerSteps(ledger)).clear_old()

        old, recent = ledger.get("old"), ledger.get("recent")
        assert old is not None and (old.body, old.outcome) == ("", None)  # a tombstone
        assert recent is not None and recent.body and recent.outcome
    assert read_tail(home, "old") is None
    assert read_tail(home, "recent") == "recent stderr\n"


async def test_a_tail_folder_that_cannot_be_listed_is_logged_and_the_ledger_still_pruned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    now = time.time()
    home = tmp_path / "home"
    home.mkdir()
    (home / "stderr").write_text("not a folder")  # listing it fails (ENOTDIR)
    with Ledger.open(tmp_path / "ledger.sqlite3") as ledger:
        reported(ledger, "old", now - KEEP_RUNS_S - DAY_S)
        await DailyPass(home, Bounds(), LedgerSteps(ledger)).clear_old()
        old = ledger.get("old")
        assert old is not None and old.body == ""
    assert "could not prune the stderr tails" in caplog.text
