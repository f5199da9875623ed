"""Issue 27 point 1: whatever reaches a completion can be sent (docs/protocol.md §7,
"every string in a completion is valid UTF-8, always")."""

from __future__ import annotations

import json
import os

import pytest

from prohost.wire.changes import CheckoutChanges, FileChange, UnreadableCheckout
from prohost.wire.runs import Outcome

pytestmark = pytest.mark.protocol("§7")

BAD = os.fsdecode(b"bad\xff\xfe.txt")  # as os.fsdecode reads a name that is not UTF-8


def sent(outcome: Outcome) -> dict[str, object]:
    """The completion as the reporter encodes it: strictly, as UTF-8."""
    body = json.dumps(outcome.completion("run_01"), ensure_ascii=False).encode("utf-8")
    decoded: dict[str, object] = json.loads(body)
    return decoded


def test_a_completion_holding_lone_surrogates_goes_out_with_u_fffd() -> None:
    entry = CheckoutChanges(repo="app", branch=None, base=None, head=None, commits=0,
                            files=[FileChange(path=BAD, change="added", added=1, removed=0,
                                              committed=False)], more_files=0)
    done = sent(Outcome(ok=True, reply=f"made {BAD}", session_id="s\udcff",
                        changes=[entry, UnreadableCheckout("lib", f"git: {BAD}")]))
    assert done["reply"] == "made bad\ufffd\ufffd.txt" and done["session_id"] == "s\ufffd"
    changes = done["changes"]
    assert isinstance(changes, list)
    assert changes[0]["files"][0]["path"] == "bad\ufffd\ufffd.txt"
    assert changes[1]["error"] == "git: bad\ufffd\ufffd.txt"


def test_a_failure_from_the_outbox_is_sendable_too() -> None:
    kept = Outcome.failure(f"the agent exited with status 1: {BAD}").to_json()
    done = sent(Outcome.from_json(kept))
    assert done["error"] == "the agent exited with status 1: bad\ufffd\ufffd.txt"
