"""The history ``prohost agent runs`` lists (:func:`read_history`), read from a real
sqlite ledger file: a saved outcome is shown field by field, and one the ledger
keeps damaged (another version's, a half-written one, not JSON at all) still lists
its run with whatever of it can be read, never raising."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prohost.engine.ledger import Ledger
from prohost.engine.ledger.history import CheckoutHead, PastRun, read_history
from prohost.wire.changes import CheckoutChanges, UnreadableCheckout
from prohost.wire.runs import Outcome, parse_body
from prohost.wire.usage import Usage

NOW = 1_700_000_000.0


def finished_with(tmp_path: Path, outcome: str) -> PastRun:
    """The one run of a new ledger, finished with ``outcome`` saved as it is."""
    path = tmp_path / "ledger.sqlite3"
    body = json.dumps({"run_id": "run_1", "completion_path": "/runs/run_1/done",
                       "text": "hello", "conversation_id": "C1"})
    with Ledger.open(path) as ledger:
        ledger.admit("run_1", parse_body(body).lane, body, NOW)
        ledger.mark_started("run_1", NOW + 1)
        ledger.mark_finished("run_1", outcome, NOW + 2)
    [run] = read_history(path)
    return run


def test_a_saved_outcome_is_shown_field_by_field(tmp_path: Path) -> None:
    changed = CheckoutChanges(repo="app", branch="prohost/conv-C1", base="a" * 40,
                              head="b" * 40, commits=1, files=[], more_files=0)
    outcome = Outcome(ok=False, error="agent exited with status 3", duration_ms=1200,
                      usage=Usage(cost_usd=0.25), account="work",
                      changes=[changed, UnreadableCheckout(repo="lib", error="gone")])
    run = finished_with(tmp_path, outcome.to_json())
    assert run == PastRun(
        run_id="run_1", conversation_id="C1", state="finished", ok=False,
        error="agent exited with status 3", accepted_at=NOW, started_at=NOW + 1,
        finished_at=NOW + 2, duration_ms=1200, account="work", cost_usd=0.25,
        checkouts=(CheckoutHead(repo="app", branch="prohost/conv-C1", head="b" * 40),))


@pytest.mark.parametrize("saved", ["", '{"ok": tru', "[1, 2]", '"ok"', "null"],
                         ids=["empty", "not JSON", "a list", "a string", "null"])
def test_an_unreadable_outcome_still_lists_its_run(tmp_path: Path, saved: str) -> None:
    run = finished_with(tmp_path, saved)
    assert (run.run_id, run.conversation_id, run.state) == ("run_1", "C1", "finished")
    assert (run.ok, run.error, run.duration_ms, run.account, run.cost_usd,
            run.checkouts) == (None, None, None, None, None, ())
    assert run.finished_at == NOW + 2


def test_a_damaged_outcome_keeps_every_field_that_can_be_read(tmp_path: Path) -> None:
    """One bad field costs that field, not the row: ``Outcome.from_json`` would refuse
    this whole outcome (``ok`` is not a bool, a changes entry lacks its counts), so
    the history reads the fields one by one."""
    saved = json.dumps({"ok": "perhaps", "error": "the agent was stopped",
                        "duration_ms": "5", "account": "work",
                        "usage": {"cost_usd": 0.5, "turns": "many"},
                        "changes": [{"repo": "app", "branch": None, "head": "c" * 40},
                                    {"repo": 7, "branch": "x"}, "junk"]})
    run = finished_with(tmp_path, saved)
    assert (run.ok, run.duration_ms) == (None, None)
    assert (run.error, run.account, run.cost_usd) == ("the agent was stopped", "work", 0.5)
    assert run.checkouts == (CheckoutHead(repo="app", branch=None, head="c" * 40),)
