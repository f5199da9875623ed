"""§3's order of faults, in the pure classifier: 413, 401, 400, then the ledger, then 503.

``intake.classify`` decides everything about the frame itself. The 503 of a drain
or of every account being limited is not an ack it sends: it comes back as the
run's ``refusal``, which admission applies only once the ledger has said it does
not know the run (tests/engine/supervisor/test_redelivery_never_503.py drives that part
through a harness).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from prohost.wire import intake
from prohost.wire.outcomes import all_limited_reason
from prohost.wire.protocol import Delivery
from prohost.wire.signature import sign

pytestmark = pytest.mark.protocol("§3")

SECRET = "pairing-secret"
NOW = 1_764_668_400
LIMITED = all_limited_reason(1_800_000_000)


def body(run_id: str = "r1", **fields: Any) -> str:
    return json.dumps({"run_id": run_id, "completion_path": f"/v1/agent/runs/{run_id}/complete",
                       "text": "hello", **fields})


def delivery(text: Any, *, signed: bool = True, event: str = "agent.run",
             timestamp: int = NOW) -> Delivery:
    signature = sign(SECRET, timestamp, text) if signed and isinstance(text, str) else None
    return Delivery(id="d1", event=event, timestamp=timestamp, body=text, signature=signature)


def verdict(frame: Delivery, *, draining: bool = False, unavailable: str | None = None,
            allow_unverified: bool = False) -> intake.Verdict:
    return intake.classify(frame, secret=SECRET, now=NOW, draining=draining,
                           allow_unverified=allow_unverified, unavailable=unavailable)


REFUSING = [
    pytest.param({"draining": True}, intake.SHUTTING_DOWN, id="draining"),
    pytest.param({"unavailable": LIMITED}, LIMITED, id="every account limited"),
    # Both: the drain is what the sender should hear (it will not pass with a reset).
    pytest.param({"draining": True, "unavailable": LIMITED}, intake.SHUTTING_DOWN, id="both"),
]


@pytest.mark.protocol("§9", "§12")
@pytest.mark.parametrize(("state", "refusal"), REFUSING)
def test_a_valid_run_is_not_refused_here_but_carries_its_503_for_the_ledger_to_apply(
    state: dict[str, Any], refusal: str
) -> None:
    found = verdict(delivery(body()), **state)
    assert (found.status, found.reason) == (200, "accepted")
    assert found.run is not None and found.run.run_id == "r1"
    assert found.refusal == refusal


def test_a_valid_run_in_the_normal_state_has_no_refusal() -> None:
    found = verdict(delivery(body()))
    assert found.run is not None and found.refusal is None


@pytest.mark.protocol("§9", "§12")
@pytest.mark.parametrize(("state", "refusal"), REFUSING)
def test_413_then_401_then_400_outrank_the_503(state: dict[str, Any], refusal: str) -> None:
    huge = body(text="x" * intake.MAX_BODY_BYTES)
    # Every fault at once: over 1 MiB, unsigned, and (being cut short) not a body.
    assert verdict(delivery(huge[:-1], signed=False), **state).status == 413
    # Unsigned and not JSON: 401.
    assert verdict(delivery("{not json", signed=False), **state).status == 401
    stale = delivery(body(), timestamp=NOW - 301)
    assert verdict(stale, **state).status == 401
    # Signed, but not a body: 400, naming what is wrong.
    bad = verdict(delivery(body(completion_path="https://evil.example/x")), **state)
    assert bad.status == 400 and "completion_path" in bad.reason
    assert bad.run is None
    not_json = verdict(delivery("{not json"), **state)
    assert not_json.status == 400 and not_json.run is None
    # A body that is not a string: 401 (it cannot have been signed), 400 once let through.
    assert verdict(delivery({"run_id": "r1"}, signed=False), **state).status == 401
    assert verdict(delivery({"run_id": "r1"}, signed=False), allow_unverified=True,
                   **state).status == 400
    # Only then the run, with the 503 it gets if the ledger does not know it.
    assert verdict(delivery(body()), **state).refusal == refusal


@pytest.mark.protocol("§9", "§12")
def test_an_event_other_than_agent_run_is_ignored_even_while_new_work_is_refused() -> None:
    found = verdict(delivery(body(), event="agent.ping"), draining=True, unavailable=LIMITED)
    assert found.status == 204 and found.run is None


def test_an_unverified_run_still_carries_its_refusal() -> None:
    found = verdict(delivery(body(), signed=False), draining=True, allow_unverified=True)
    assert found.run is not None and found.unverified is not None
    assert found.refusal == intake.SHUTTING_DOWN


@pytest.mark.protocol("§12")
def test_a_long_limit_reason_is_cut_like_every_reason() -> None:
    found = verdict(delivery(body()), unavailable="x" * 10_000)
    assert found.refusal is not None and len(found.refusal) == intake.MAX_REASON_CHARS
