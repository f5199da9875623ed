"""Property-based fuzzing of the reader and intake (issue 8, docs/protocol.md §2–§3).

The production :class:`Harness` (its :class:`Link`, decoder, intake) is connected
to the reference server on 127.0.0.1, and Hypothesis makes the server send it
frames: valid signed deliveries, the same with one hostile change (a field, the
signature, the event, the body's text), random JSON, random text, and valid frames
with characters inserted, deleted or replaced. After each example's frames the
test pings and waits for the pong (frames are handled in order), then checks:

- nothing escaped: the harness is still running, on its first and only connection,
  and logged no "could not be handled" (the reader's net for bugs);
- every frame that is a JSON object with ``"type": "delivery"`` and a string ``id``
  got exactly one ack, and no other ack was sent;
- every ack's status is one of §3's, and the one the change calls for when the
  frame was built with a known fault; valid runs among them are accepted (200).

One trio run and one connection serve every example: Hypothesis runs in a worker
thread and hands each example's frames to the trio loop. ``--dry-run`` keeps it
fast (no ledger, no agents); tests/wire/test_hostile_input.py runs the same inputs with
a ledger and real agents, and tests/engine/supervisor/test_admission_fuzz.py fuzzes
what only a ledger answers (runs held, reported, a full queue, every account
limited).
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prohost.server import ServerState
from prohost.wire import protocol
from prohost.wire.intake import MAX_BODY_BYTES
from prohost.wire.protocol import Ack, Delivery, Pong
from prohost.wire.signature import sign
from tests.kits.harness import Running, running_harness, running_server

pytestmark = pytest.mark.protocol("§2", "§3")

#: Every status §3 allows.
STATUSES = frozenset({200, 204, 400, 401, 413, 503})
#: Frames per example and examples per run: over 10,000 frames in all.
FRAMES = 101
EXAMPLES = 100


@attrs.frozen
class Frame:
    """A frame to send, rendered from what Hypothesis drew once a unique id is known."""

    render: Callable[[str, str, int], str]  # (delivery id, secret, now) -> text
    #: The status the frame's one fault calls for, when it was built with one.
    status: int | None = None
    label: str = ""


def run_body(run_id: str, fields: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"run_id": run_id, "conversation_id": "C1",
                            "completion_path": f"/v1/agent/runs/{run_id}/complete",
                            "text": "hello"}
    body.update(fields or {})
    return body


def delivery(body_text: Any, delivery_id: str, secret: str, now: int, *,
             event: Any = "agent.run", timestamp: Any = None,
             signature: Any = True) -> str:
    ts = now if timestamp is None else timestamp
    frame: dict[str, Any] = {"type": "delivery", "id": delivery_id, "event": event,
                             "timestamp": ts, "body": body_text}
    if signature is True:
        frame["signature"] = sign(secret, ts, body_text)
    elif signature is not None:
        frame["signature"] = signature
    return json.dumps(frame)


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


def with_raw(body: dict[str, Any], raw: str) -> str:
    """The body's JSON with ``raw`` (text json.dumps would not write) as one more member."""
    return json.dumps(body)[:-1] + ", " + raw + "}"


# Body changes that make a 400, each with the text the ack's reason must hold.
BAD_FIELDS: list[tuple[str, Any]] = [
    ("run_id", "."), ("run_id", ".."), ("run_id", ""), ("run_id", "a b"), ("run_id", "r" * 129),
    ("run_id", 7), ("run_id", None), ("run_id", "r\ud800"),
    ("conversation_id", ""), ("conversation_id", "c" * 257), ("conversation_id", 5),
    ("conversation_id", "c\ud800"), ("conversation_id", ["C1"]),
    ("text", None), ("text", 5), ("text", "\ud800"), ("text", "a\udfffb"), ("text", {"x": 1}),
    ("completion_path", "https://evil.example/x"), ("completion_path", "//evil.example/x"),
    ("completion_path", "/a/../b"), ("completion_path", "/a/%252e%252e/b"),
    ("completion_path", ""), ("completion_path", 5), ("timeline_path", "x"),
    ("context", "not a list"), ("context", [{"text": 5}]), ("context", [{"text": "\udc00"}]),
    ("mcp", {"url": 5}), ("mcp", "x"), ("author", "\ud83d"), ("created_at", "yesterday"),
]
RAW_MEMBERS = [
    '"x": ' + deep(2_000), '"x": ' + deep(100_000), '"n": ' + "8" * 5_000,
    '"n": -' + "8" * 5_000, '"n": NaN', '"n": Infinity', '"n": -Infinity', '"n": 1e999',
    '"run_id": "again"', '"s": "\\ud800"', '"\\udc00": 1',
]
NOT_OBJECTS = ["[]", "[1, 2]", "1", "-0.5", '"s"', "null", "true", "", "{", "{}}", "\ud800",
               '{"a": 1,}', "\x00"]


@st.composite
def fuzz_frame(draw: st.DrawFn, runs: itertools.count[int]) -> Frame:
    kind = draw(st.sampled_from([
        "valid", "valid", "valid", "bad_field", "bad_field", "bad_field", "raw_member",
        "raw_member", "not_object", "surrogate_in_body_text", "bad_signature", "bad_timestamp",
        "other_event", "body_not_string", "random_json", "random_object", "random_object",
        "random_text", "mutated", "mutated", "mutated", "ping",
    ]))
    if kind == "valid" and draw(st.integers(0, 15)) == 15:
        kind = "too_large"  # rarely: a megabyte each
    run_id = f"fz{next(runs)}"  # a fresh run for every frame, never seen before
    if kind == "valid":
        text = json.dumps(run_body(run_id))
        return Frame(lambda i, s, now: delivery(text, i, s, now), 200, kind)
    if kind == "bad_field":
        name, value = draw(st.sampled_from(BAD_FIELDS))
        text = json.dumps(run_body(run_id, {name: value}))
        return Frame(lambda i, s, now: delivery(text, i, s, now), 400, f"{kind} {name}")
    if kind == "raw_member":
        raw = draw(st.sampled_from(RAW_MEMBERS))
        text = with_raw(run_body(run_id), raw)
        return Frame(lambda i, s, now: delivery(text, i, s, now), 400, f"{kind} {raw[:20]}")
    if kind == "not_object":
        text = draw(st.sampled_from(NOT_OBJECTS))
        return Frame(lambda i, s, now: delivery(text, i, s, now), 400, kind)
    if kind == "surrogate_in_body_text":
        text = json.dumps(run_body(run_id, {"text": "x\ud800"})).replace("\\ud800", "\ud800")
        return Frame(lambda i, s, now: delivery(text, i, s, now), 400, kind)
    if kind == "bad_signature":
        signature = draw(st.sampled_from([None, "", "v1=00", "v1=" + "0" * 64, 5, ["v1"],
                                          "v1=\ud800", "é" * 70]))
        text = json.dumps(run_body(run_id))
        return Frame(lambda i, s, now: delivery(text, i, s, now, signature=signature), 401,
                     kind)
    if kind == "bad_timestamp":
        offset = draw(st.sampled_from([-301, 301, 10**12, -(10**400)]))
        stamp = draw(st.sampled_from(["soon", None, 1.5, True, [1]]) | st.just(offset))
        text = json.dumps(run_body(run_id))

        def render(i: str, s: str, now: int) -> str:
            ts = now + stamp if isinstance(stamp, int) and not isinstance(stamp, bool) else stamp
            frame = json.loads(delivery(text, i, s, now))
            frame["timestamp"] = ts
            return json.dumps(frame)

        return Frame(render, 401, kind)
    if kind == "other_event":
        event = draw(st.sampled_from(["agent.ping", "", None, 5, "x\ud800", ["agent.run"]]))
        text = json.dumps(run_body(run_id))
        return Frame(lambda i, s, now: delivery(text, i, s, now, event=event), 204, kind)
    if kind == "body_not_string":
        body = draw(st.sampled_from([run_body(run_id), None, 5, [1], {"x": [[1]]}]))
        return Frame(lambda i, s, now: json.dumps({"type": "delivery", "id": i, "body": body,
                                                   "timestamp": now, "signature": "v1=00"}),
                     401, kind)
    if kind == "too_large":
        text = json.dumps(run_body(run_id, {"text": "x" * MAX_BODY_BYTES}))
        return Frame(lambda i, s, now: delivery(text, i, s, now, signature=None), 413, kind)
    if kind == "random_json":
        value = draw(JSON)
        return Frame(lambda i, s, now: json.dumps(value), None, kind)
    if kind == "random_object":
        fields = draw(st.dictionaries(st.sampled_from(
            ["id", "event", "timestamp", "signature", "body", "run_id", "reason", "seq",
             "cancel", "unknown", "heartbeat_s", "x"]), JSON, max_size=6))
        kind_field = draw(st.sampled_from(
            ["delivery", "ping", "cancel", "heartbeat_ack", "hello", "ack", "status", "nope"])
            | JSON)
        frame = {"type": kind_field, **fields}
        return Frame(lambda i, s, now: json.dumps(frame), None, f"{kind} {kind_field!r}")
    if kind == "random_text":
        noise = draw(st.text(st.characters(exclude_categories=("Cs",)), max_size=80))
        return Frame(lambda i, s, now: noise, None, kind)
    if kind == "ping":
        ping_id = draw(JSON)
        return Frame(lambda i, s, now: json.dumps({"type": "ping", "id": ping_id}), None, kind)
    # "mutated": a valid delivery with a few characters changed.
    edits = draw(st.lists(st.tuples(
        st.floats(0, 1), st.sampled_from(["insert", "delete", "replace"]),
        st.sampled_from(['"', "\\", "{", "}", "[", "]", ",", ":", "0", "-", "e", "x", "é",
                         "\\ud800", "\\u0000", " ", "9" * 5_000, "[" * 3_000])),
        min_size=1, max_size=3))
    text = json.dumps(run_body(run_id))

    def mutate(i: str, s: str, now: int) -> str:
        frame = delivery(text, i, s, now)
        for where, how, what in edits:
            at = int(where * len(frame))
            tail = frame[at + 1:] if how != "insert" else frame[at:]
            frame = frame[:at] + ("" if how == "delete" else what) + tail
        return frame

    return Frame(mutate, None, kind)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=6,
)


class _Number(str):
    """A JSON number as the oracle reads it: its text, kept apart from strings (a
    delivery whose id is the number 0 has no string id, and gets no ack)."""


def oracle_ack_id(text: str) -> str | None:
    """The id the harness must ack for this frame (§2–§3), or None for no ack: a JSON
    object of type "delivery" with a string id. Read as leniently as the harness
    reads (any number, even one Python cannot hold, is read — as a number, never as
    a string id; the last of duplicate keys wins)."""
    try:
        data = json.loads(text, parse_int=_Number, parse_float=_Number,
                          parse_constant=_Number)
    except (ValueError, RecursionError):
        return None
    if isinstance(data, dict) and data.get("type") == "delivery" and isinstance(
            data.get("id"), str) and not isinstance(data["id"], _Number):
        return str(data["id"])
    return None


async def test_no_frame_can_break_the_reader(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    ids = itertools.count()
    runs = itertools.count()
    sent = collections.Counter[str]()
    with trio.fail_after(600):
        async with running_server(redeliver_after_s=3600) as server, running_harness(
            server, tmp_path, exec_command="true", dry_run=True
        ) as running:
            secret = running.creds.secret

            async def one_example(frames: list[Frame]) -> None:
                start = len(server.state.received), len(caplog.records)
                expected = collections.Counter[str]()
                exact: dict[str, Frame] = {}
                now = int(time.time())
                for frame in frames:
                    # Frames built with a known fault get "d" ids; the rest (a
                    # mutation may change their id) "m" ids, which no edit turns
                    # into a "d" one.
                    prefix = "m" if frame.status is None else "d"
                    delivery_id = f"{prefix}{next(ids)}"
                    text = frame.render(delivery_id, secret, now)
                    ack_id = oracle_ack_id(text)
                    if ack_id is not None:
                        expected[ack_id] += 1
                        if ack_id == delivery_id:
                            exact[ack_id] = frame
                    sent["frames"] += 1
                    await server.send_raw(text)
                await check_example(running, caplog, start, expected, exact, f"end{next(ids)}")
                sent["examples"] += 1

            def fuzz() -> None:
                @settings(max_examples=EXAMPLES, derandomize=True, deadline=None,
                          database=None, suppress_health_check=list(HealthCheck))
                @given(st.lists(fuzz_frame(runs), min_size=FRAMES, max_size=FRAMES))
                def example(frames: list[Frame]) -> None:
                    trio.from_thread.run(one_example, frames)

                example()

            await trio.to_thread.run_sync(fuzz)
            assert sent["frames"] >= 10_000
            assert server.state.total_connects == 1 and running.exit_code == []


async def check_example(
    running: Running,
    caplog: pytest.LogCaptureFixture,
    start: tuple[int, int],
    expected: collections.Counter[str],
    exact: dict[str, Frame],
    ping_id: str,
) -> None:
    server = running.server
    await server.send_raw(json.dumps({"type": "ping", "id": ping_id}))

    def answered(state: ServerState) -> bool:
        # Only this example's messages: scanning them all each time adds up.
        return any(isinstance(entry.message, Pong) and entry.message.id == ping_id
                   for entry in state.received[start[0]:])

    await server.wait_until(answered)
    acks = [entry.message for entry in server.state.received[start[0]:]
            if isinstance(entry.message, Ack)]
    assert collections.Counter(ack.id for ack in acks) == expected, (
        "every delivery with a string id is acked exactly once, and nothing else is")
    for ack in acks:
        frame = exact.get(ack.id)
        label = frame.label if frame else "?"
        assert ack.status in STATUSES, (label, ack)
        if frame is not None and frame.status is not None and expected[ack.id] == 1:
            assert ack.status == frame.status, (label, ack)
    assert not server.state.malformed, "every message the harness sent is valid"
    assert server.state.total_connects == 1 and server.state.connected == 1
    assert running.exit_code == []
    bugs = [r for r in caplog.records[start[1]:] if "could not be handled" in r.getMessage()]
    assert not bugs, bugs[0].getMessage()


@pytest.mark.parametrize(("text", "ack_id"), [
    ('{"type": "delivery", "id": "0"}', "0"),
    ('{"type": "delivery", "id": 0}', None),  # a number is no string id: no ack
    ('{"type": "delivery", "id": 1e999}', None),
    ('{"type": "delivery", "id": NaN}', None),
    ('{"type": "delivery", "id": 0, "id": "7"}', "7"),  # the last key wins
    ('{"type": "delivery", "id": "7", "id": 0}', None),
])
def test_the_oracle_expects_an_ack_only_for_a_string_id(text: str, ack_id: str | None) -> None:
    # Hypothesis drew {"type": "delivery", "id": 0} one day: an oracle that read
    # numbers as text expected an ack the harness rightly never sent.
    assert oracle_ack_id(text) == ack_id
    decoded: object
    try:
        decoded = protocol.decode(text)
    except protocol.DecodeError:
        decoded = None
    assert (decoded.id if isinstance(decoded, Delivery) else None) == ack_id
