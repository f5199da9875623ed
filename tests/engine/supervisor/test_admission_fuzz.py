"""Property-based fuzzing of ledger-backed admission (docs/protocol.md §3; issue 16).

tests/wire/test_reader_fuzz.py fuzzes the reader with ``--dry-run``, where no run is
ever held, reported or refused for a full queue. Here the production harness has a
real sqlite ledger and ``--max-queued 6``, and Hypothesis makes the reference
server send it deliveries of new runs, of runs it holds (queued) and of runs it
has reported, each clean or with one fault (over 1 MiB, unsigned, stale, a bad
field, not JSON, another event), while the test moves the harness between its
states: every account limited or not, the queue full or not (cancels from the
server report queued runs and free their places).

A model of what the harness holds, updated frame by frame in the order the
harness reads them, gives the one ack §3 allows for each: 413, 401, 400, then
the ledger's 200 ("already accepted") or 204 ("already reported"), and only then
the 503 of a new run (every account limited, queue full) or its 200. The test
also asserts that each of those answers was actually produced, so the fuzz
reaches every branch of admission, not just the parser.

The harness's one slot is taken by a run on another lane, held open by the test's
agent (:class:`tests.kits.harness.Gate`), so accepted runs stay queued and no other agent
runs: the queue's length is the model's to know.
"""

from __future__ import annotations

import collections
import itertools
import json
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prohost.engine.accounts.book import AccountBook
from prohost.engine.ledger import Ledger
from prohost.server import ServerState
from prohost.wire import intake
from prohost.wire.outcomes import all_limited_reason
from prohost.wire.protocol import Ack, Pong
from prohost.wire.runs import Outcome
from prohost.wire.signature import sign
from tests.kits.harness import Gate, Running, running_harness, running_server

pytestmark = pytest.mark.protocol("§3")

MAX_QUEUED = 6
EXAMPLES = 60
LANE = "conv:C1"
#: Faults with the status §3 gives each; None is a clean delivery.
FAULTS: dict[str | None, int | None] = {
    None: None, "unsigned": 401, "stale": 401, "bad_field": 400, "not_json": 400,
    "other_event": 204, "too_large": 413,
}


@attrs.frozen
class Intent:
    """One delivery as drawn: which run it is for, and its one fault (if any)."""

    target: str  # "new" | "held" | "reported"
    pick: int  # which of the held or reported runs
    fault: str | None


@attrs.frozen
class Example:
    limited: bool
    intents: list[Intent]
    #: How many held runs the server cancels after the example (each is reported).
    cancels: int


#: Clean deliveries are the most common; a megabyte body is rare (it is slow to send).
DRAWN_FAULTS: list[str | None] = [None, None, None, None, "unsigned", "stale", "bad_field",
                                  "not_json", "other_event"]
INTENT = st.builds(
    Intent,
    target=st.sampled_from(["new", "new", "held", "reported"]),
    pick=st.integers(0, 1000),
    fault=st.integers(0, 8 * len(DRAWN_FAULTS) - 1).map(
        lambda n: "too_large" if n == 13 else DRAWN_FAULTS[n % len(DRAWN_FAULTS)]),
)
EXAMPLE = st.builds(
    Example,
    limited=st.integers(0, 3).map(lambda n: n == 0),
    intents=st.lists(INTENT, min_size=8, max_size=30),
    cancels=st.integers(0, 3),
)


@attrs.define
class Model:
    """What the harness holds, as the test has told it so far."""

    held: list[str] = attrs.Factory(list)
    reported: list[str] = attrs.Factory(list)
    fresh: itertools.count[int] = attrs.Factory(itertools.count)
    #: Every (status, reason) the harness answered, counted.
    answers: collections.Counter[tuple[int, str]] = attrs.Factory(collections.Counter)
    #: The 503 reason while every account is limited.
    limited_reason: str = ""


def body_of(run_id: str, **fields: Any) -> str:
    return json.dumps({"run_id": run_id, "conversation_id": "C1",
                       "completion_path": f"/v1/agent/runs/{run_id}/complete",
                       "text": "hello", **fields})


def render(intent: Intent, run_id: str, delivery_id: str, secret: str, now: int) -> str:
    fault = intent.fault
    text = body_of(run_id)
    event = "agent.run"
    timestamp = now - 301 if fault == "stale" else now
    if fault == "bad_field":
        text = body_of(run_id, completion_path="https://evil.example/x")
    elif fault == "not_json":
        text = text[:-1]
    elif fault == "other_event":
        event = "agent.ping"
    elif fault == "too_large":
        text = body_of(run_id, text="x" * intake.MAX_BODY_BYTES)
    frame: dict[str, Any] = {"type": "delivery", "id": delivery_id, "event": event,
                             "timestamp": timestamp, "body": text}
    if fault not in ("unsigned", "too_large"):
        frame["signature"] = sign(secret, timestamp, text)
    return json.dumps(frame)


def expect(model: Model, intent: Intent, limited_reason: str | None) -> tuple[int, str | None]:
    """The ack §3 calls for, given the model; updates the model for a new run."""
    status = FAULTS[intent.fault]
    if status is not None:
        return status, None
    if intent.target == "reported":
        return 204, "already reported"
    if intent.target == "held":
        return 200, "already accepted"
    if limited_reason is not None:
        return 503, limited_reason
    if len(model.held) >= MAX_QUEUED:
        return 503, intake.QUEUE_FULL
    return 200, "accepted"


def seed_reported(ledger: Ledger, model: Model, count: int) -> None:
    """Runs this harness ran and reported before (as a previous process left them)."""
    for n in range(count):
        run_id = f"done{n}"
        now = time.time()
        ledger.admit(run_id, LANE, body_of(run_id), now)
        ledger.mark_started(run_id, now)
        ledger.mark_finished(run_id, Outcome(ok=True, reply="old").to_json(), now)
        ledger.mark_reported(run_id, "delivered: 200", now)
        model.reported.append(run_id)


async def test_fuzzed_deliveries_reach_every_answer_of_ledger_backed_admission(
    tmp_path: Path,
) -> None:
    model = Model()
    ids = itertools.count()
    gate = Gate()
    # The server does not know the runs the fuzz sends; a heartbeat would have it tell
    # the harness to forget them (heartbeat_ack.unknown). The fuzz takes a few
    # seconds, well inside the harness's longest heartbeat period (120 s).
    with trio.fail_after(240):
        async with trio.open_nursery() as gate_nursery, \
                running_server(heartbeat_s=3600) as server:
            await gate_nursery.start(gate.serve)
            async with running_harness(server, tmp_path, exec_command=gate.command,
                                       max_queued=MAX_QUEUED) as running:
                await fuzz_through(gate, running, model, ids)
            gate_nursery.cancel_scope.cancel()
    check_answers(model)


async def fuzz_through(gate: Gate, running: Running, model: Model,
                       ids: itertools.count[int]) -> None:
    """The fuzz itself, against a harness whose agent is ``gate``."""
    server, harness, ledger = running.server, running.harness, running.ledger
    assert ledger is not None
    busy = await server.submit_run("holds the one slot", conversation_id="BUSY")
    await gate.wait_started(busy)
    seed_reported(ledger, model, 3)
    usable_book = harness.admission.book
    limited_book = AccountBook()
    until = time.time() + 3600
    limited_book.restore("default", until, time.time())
    limited_reason = model.limited_reason = all_limited_reason(until)

    async def one_example(example: Example) -> None:
        # Every account limited, as a restart that remembered the limits finds it.
        harness.admission.book = limited_book if example.limited else usable_book
        start = len(server.state.received)
        now = int(time.time())
        sent: list[tuple[str, Intent, tuple[int, str | None]]] = []
        for intent in example.intents:
            pool = model.held if intent.target == "held" else model.reported
            if intent.target != "new" and not pool:
                intent = attrs.evolve(intent, target="new")
            run_id = (f"fz{next(model.fresh)}" if intent.target == "new"
                      else pool[intent.pick % len(pool)])
            expected = expect(model, intent, limited_reason if example.limited
                              else None)
            if expected == (200, "accepted"):
                model.held.append(run_id)
            delivery_id = f"d{next(ids)}"
            sent.append((delivery_id, intent, expected))
            await server.send_raw(render(intent, run_id, delivery_id,
                                         running.creds.secret, now))
        await answered(running, start, f"ping{next(ids)}")
        acks = {entry.message.id: entry.message
                for entry in server.state.received[start:]
                if isinstance(entry.message, Ack)}
        assert len(acks) == len(sent), "every delivery is acked once"
        for delivery_id, intent, (status, reason) in sent:
            ack = acks[delivery_id]
            assert ack.status == status, (intent, ack)
            if reason is not None:
                assert ack.reason == reason, (intent, ack)
            model.answers[ack.status, ack.reason if reason is not None else ""] += 1
        # The server cancels a few queued runs: each is reported, and its place
        # in the queue is free again.
        for _ in range(min(example.cancels, len(model.held))):
            run_id = model.held.pop(0)
            await server.send_raw(json.dumps({"type": "cancel", "run_id": run_id}))
            await harness.wait_until(lambda h, r=run_id: r not in h.held)
            model.reported.append(run_id)
        assert harness.scheduler.statistics().queued == len(model.held)

    def fuzz() -> None:
        @settings(max_examples=EXAMPLES, derandomize=True, deadline=None,
                  database=None, suppress_health_check=list(HealthCheck))
        @given(EXAMPLE)
        def example(drawn: Example) -> None:
            trio.from_thread.run(one_example, drawn)

        example()

    await trio.to_thread.run_sync(fuzz)
    assert server.state.total_connects == 1 and running.exit_code == []
    # The queued runs are reported "not started"; none of them ran.
    harness.drain()
    await gate.release(busy)
    assert await running.wait_exit() == 0
    assert gate.started == [busy]


def check_answers(model: Model) -> None:
    """Every answer of admission was produced, not just possible."""
    answers = model.answers
    assert answers[200, "accepted"] > 0
    assert answers[200, "already accepted"] > 0
    assert answers[204, "already reported"] > 0
    assert answers[503, intake.QUEUE_FULL] > 0
    assert answers[503, model.limited_reason] > 0
    for status in (400, 401, 204):
        assert answers[status, ""] > 0


async def answered(running: Running, start: int, ping_id: str) -> None:
    """Return once the harness has answered every frame sent before (it reads in order)."""
    server = running.server
    await server.send_raw(json.dumps({"type": "ping", "id": ping_id}))

    def ponged(state: ServerState) -> bool:
        return any(isinstance(entry.message, Pong) and entry.message.id == ping_id
                   for entry in state.received[start:])

    await server.wait_until(ponged)
