"""The §7 and §8 shapes in ``wire/`` (issue 26): written by the converter exactly as
the hand-made dicts were, and an outcome saved by an earlier version read back."""

from __future__ import annotations

import json

import pytest

from prohost.wire.changes import CheckoutChanges, FileChange, UnreadableCheckout
from prohost.wire.protocol import converter
from prohost.wire.runs import Outcome
from prohost.wire.timeline import ToolEvent
from prohost.wire.usage import Usage

pytestmark = pytest.mark.protocol("§7")

FULL = {"repo": "app", "branch": None, "base": "a" * 40, "head": "b" * 40, "commits": 1,
        "files": [{"path": "src/app.py", "change": "modified", "added": 10, "removed": 2,
                   "committed": True},
                  {"path": "img.bin", "change": "added", "added": None, "removed": None,
                   "committed": False},
                  {"path": "new.txt", "change": "renamed", "added": 0, "removed": 0,
                   "committed": True, "from": "old.txt"}],
        "more_files": 0}
UNREAD = {"repo": "lib", "error": "no private worktree: not a git checkout"}
USAGE = {"input_tokens": 1200, "output_tokens": 380, "cache_read_tokens": 900,
         "cache_write_tokens": 50, "cost_usd": 0.0123, "turns": 3, "model": "claude-sonnet-4-5"}

#: An outcome as the ledger of an earlier version kept it (Outcome.to_json then).
SAVED = ('{"ok":false,"reply":null,"error":"the agent exited with status 1","retryable":false,'
         '"session_id":"s1","duration_ms":48211,"usage":' + json.dumps(USAGE, separators=(",", ":"))
         + ',"changes":[' + json.dumps(FULL, separators=(",", ":")) + ","
         + json.dumps(UNREAD, separators=(",", ":")) + '],"account":"work"}')


def test_an_outcome_saved_before_reads_back_typed_and_writes_the_same() -> None:
    outcome = Outcome.from_json(SAVED)
    assert outcome.usage == Usage(**USAGE)
    assert outcome.changes is not None
    full, unread = outcome.changes
    assert isinstance(full, CheckoutChanges) and isinstance(unread, UnreadableCheckout)
    assert full.files[2] == FileChange("new.txt", "renamed", 0, 0, True, from_="old.txt")
    assert outcome.to_json() == SAVED
    completion = json.dumps(outcome.completion("run_01"))
    assert completion == json.dumps({
        "run_id": "run_01", "ok": False, "error": "the agent exited with status 1",
        "retryable": False, "session_id": "s1", "duration_ms": 48211, "usage": USAGE,
        "changes": [FULL, UNREAD], "account": "work"})


def test_a_success_sends_its_reply_even_when_null_and_no_error() -> None:
    assert json.dumps(Outcome(ok=True).completion("r")) == \
        '{"run_id": "r", "ok": true, "reply": null}'
    assert Outcome(ok=True, reply="hi", usage=Usage(turns=1), changes=[]).completion("r") == {
        "run_id": "r", "ok": True, "reply": "hi", "usage": {"turns": 1}, "changes": []}


def test_usage_is_absent_when_nothing_is_known() -> None:
    assert Usage().known() is None and Usage().to_json() is None
    assert Usage(model="m").known() == Usage(model="m")
    assert converter.unstructure(Usage(cost_usd=0.5, turns=2)) == {"cost_usd": 0.5, "turns": 2}
    # Saved usage is read leniently: what is not valid is left out.
    saved = '{"ok":true,"usage":{"input_tokens":-1,"turns":2,"model":7}}'
    assert Outcome.from_json(saved).usage == Usage(turns=2)


@pytest.mark.protocol("§8")
def test_a_tool_event_is_its_timeline_row() -> None:
    event = ToolEvent(id="toolu_1", name="Bash", state="done", summary="pytest -q", at=1.5)
    assert list(event.to_json().items()) == [
        ("id", "toolu_1"), ("name", "Bash"), ("state", "done"), ("summary", "pytest -q"),
        ("at", 1.5)]


@pytest.mark.protocol("§13")
def test_confined_is_sent_when_known_and_absent_when_no_agent_spawned() -> None:
    assert "confined" not in Outcome(ok=True, reply="x").completion("r")
    assert Outcome(ok=True, reply="x", confined=True).completion("r")["confined"] is True
    failed = Outcome.failure("stopped", confined=False)
    assert failed.completion("r")["confined"] is False
    assert Outcome.from_json(failed.to_json()) == failed
