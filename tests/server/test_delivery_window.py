"""The reference server's delivery window and timers (issue 11, issue 9).

Two levels. The server's model (:class:`ServerState`) on a clock the test sets by
hand: what is sent at which instant (pings, resends, the retry after a 503, the
window) is asserted exactly, with no sockets and no waiting. Then the whole
server against the real harness: 10,000 runs submitted at once are all acked by
one harness over one connection, which the old server never managed (it pushed
every delivery into one outbox, called the harness "not reading" and dropped it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from prohost.server.state import DELIVERY_WINDOW, OUTBOX_SIZE, Connection, ServerState
from prohost.wire.protocol import Ack
from tests.kits.harness import running_harness, running_server

pytestmark = pytest.mark.protocol("§11")


class Clock:
    """A clock the test moves by hand (seconds)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def model(**knobs: Any) -> tuple[ServerState, Clock]:
    clock = Clock()
    return ServerState(pairing_code="ABCD-1234", clock=clock, **knobs), clock


class Peer:
    """One connection as the model sees it, and the frames queued for it."""

    def __init__(self, state: ServerState, token: str) -> None:
        self.state = state
        self.conn: Connection
        self.conn, self.inbox = state.add_connection(
            token, machine=None, agent=None, client=None, server=None
        )

    def frames(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Every frame queued since the last call (of one type, if given)."""
        out = []
        while True:
            try:
                frame: dict[str, Any] = json.loads(self.inbox.receive_nowait())
            except trio.WouldBlock:
                return [f for f in out if kind is None or f["type"] == kind]
            out.append(frame)

    def ack(self, delivery: dict[str, Any], status: int = 200) -> None:
        self.state.on_message(self.conn, Ack(id=delivery["id"], status=status, reason="r"))


def run_of(delivery: dict[str, Any]) -> str:
    run_id: str = json.loads(delivery["body"])["run_id"]
    return run_id


# ---------------------------------------------------------------------- the model's timers


@pytest.mark.protocol("§2")
async def test_pings_fall_due_every_heartbeat_from_the_connect() -> None:
    state, clock = model(heartbeat_s=7)
    peer = Peer(state, state.pair("m").token)
    assert [f["type"] for f in peer.frames()] == ["hello"]
    assert state.dispatch(clock.now) == 1007.0
    seen = []
    for at in (1006.9, 1007.0, 1013.9, 1014.0, 1021.0):
        clock.now = at
        state.dispatch(at)
        seen.append((at, [f["id"] for f in peer.frames("ping")]))
    assert seen == [
        (1006.9, []), (1007.0, ["p-1"]), (1013.9, []), (1014.0, ["p-2"]), (1021.0, ["p-3"]),
    ]


@pytest.mark.protocol("§2")
async def test_an_unacked_delivery_is_resent_after_exactly_redeliver_after_s() -> None:
    state, clock = model(redeliver_after_s=10, heartbeat_s=1000)
    token = state.pair("m").token
    peer = Peer(state, token)
    run = state.add_run("hi")
    assert state.dispatch(clock.now) == 1010.0
    (first,) = peer.frames("delivery")
    assert state.dispatch(1009.99) == 1010.0 and peer.frames("delivery") == []
    clock.now = 1010.0
    state.dispatch(clock.now)
    (second,) = peer.frames("delivery")
    assert second["id"] != first["id"] and second["body"] == first["body"]
    # Gone and back: the same harness gets it at once, not at the next timer.
    state.remove_connection(peer.conn)
    clock.now = 1011.0
    again = Peer(state, token)
    state.dispatch(clock.now)
    (third,) = again.frames("delivery")
    assert run_of(third) == run.run_id
    again.ack(third)
    clock.now = 2000.0
    state.dispatch(clock.now)
    assert again.frames("delivery") == [] and run.delivery_count == 3
    assert run.state == "accepted" and state.counts["accepted"] == 1


@pytest.mark.protocol("§3")
async def test_a_503_comes_back_soon_then_less_often_and_never_marks_the_run_done() -> None:
    state, clock = model(redeliver_after_s=10, heartbeat_s=1000)
    peer = Peer(state, state.pair("m").token)
    run = state.add_run("later")
    state.dispatch(clock.now)
    waits = []
    for _ in range(6):
        (delivery,) = peer.frames("delivery")
        acked_at = clock.now
        peer.ack(delivery, 503)
        assert run.state == "queued" and run.due_at is not None
        due = run.due_at
        clock.now = due - 0.001
        state.dispatch(clock.now)
        assert peer.frames("delivery") == []
        clock.now = due
        state.dispatch(clock.now)
        waits.append(due - acked_at)
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0]
    (delivery,) = peer.frames("delivery")
    peer.ack(delivery, 200)
    assert run.state == "accepted" and run.ack_statuses == [503] * 6 + [200]


# ---------------------------------------------------------------------- the window


async def test_no_more_than_the_window_is_in_flight_and_acks_open_it() -> None:
    state, clock = model(heartbeat_s=1000)
    peer = Peer(state, state.pair("m").token)
    runs = [state.add_run(f"r{n}") for n in range(3 * DELIVERY_WINDOW)]
    state.dispatch(clock.now)
    first = peer.frames("delivery")
    assert len(first) == DELIVERY_WINDOW < OUTBOX_SIZE
    assert [run_of(d) for d in first] == [r.run_id for r in runs[:DELIVERY_WINDOW]]
    state.dispatch(clock.now)
    assert peer.frames("delivery") == []
    for delivery in first[:10]:
        peer.ack(delivery)
    state.dispatch(clock.now)
    more = peer.frames("delivery")
    assert [run_of(d) for d in more] == [
        r.run_id for r in runs[DELIVERY_WINDOW : DELIVERY_WINDOW + 10]
    ]
    assert len(peer.conn.in_flight) == DELIVERY_WINDOW
    assert not peer.conn.cancel_scope.cancel_called
    # A resend of a delivery already in flight goes out even with the window full.
    clock.now += state.redeliver_after_s
    state.dispatch(clock.now)
    assert len(peer.frames("delivery")) == DELIVERY_WINDOW
    assert peer.conn.max_in_flight == DELIVERY_WINDOW


async def test_a_conversation_waits_for_its_harness_window_instead_of_moving() -> None:
    state, clock = model(heartbeat_s=1000, window=2)
    a_token, b_token = state.pair("a").token, state.pair("b").token
    a = Peer(state, a_token)
    first = state.add_run("one", "C1")
    state.dispatch(clock.now)
    a.ack(a.frames("delivery")[0])
    b = Peer(state, b_token)
    fill = [state.add_run(f"fill {n}", "C1") for n in range(2)]
    state.dispatch(clock.now)
    assert [run_of(d) for d in a.frames("delivery")] == [r.run_id for r in fill]
    later = state.add_run("three", "C1")
    other = state.add_run("elsewhere", "C2")
    state.dispatch(clock.now)
    # C1 stays with a (its window is full, so the run waits); C2 goes to idle b.
    assert [run_of(d) for d in b.frames("delivery")] == [other.run_id]
    assert a.frames("delivery") == [] and later.state == "queued"
    state.on_message(a.conn, Ack(id=fill[0].delivery_ids[0], status=200, reason="ok"))
    state.dispatch(clock.now)
    assert [run_of(d) for d in a.frames("delivery")] == [later.run_id]
    assert first.harness == later.harness == a_token


async def test_runs_waiting_for_a_harness_that_leaves_go_to_another() -> None:
    state, clock = model(heartbeat_s=1000, window=1, redeliver_after_s=10)
    a_token = state.pair("a").token
    a = Peer(state, a_token)
    b = Peer(state, state.pair("b").token)
    held = state.add_run("held", "C1")
    state.dispatch(clock.now)
    owner, other = (a, b) if held.harness == a_token else (b, a)
    owner.ack(owner.frames("delivery")[0])
    assert other.frames("delivery") == []
    blocker = state.add_run("fills the owner's window", "C1")
    waiting = state.add_run("waits for the owner", "C1")
    state.dispatch(clock.now)
    assert [run_of(d) for d in owner.frames("delivery")] == [blocker.run_id]
    assert other.frames("delivery") == [] and waiting.state == "queued"
    state.remove_connection(owner.conn)
    state.dispatch(clock.now)
    (moved,) = other.frames("delivery")
    assert run_of(moved) == waiting.run_id
    other.ack(moved)
    # The unacked one keeps its resend timer: it moves only when that falls due.
    clock.now += 9.9
    state.dispatch(clock.now)
    assert other.frames("delivery") == []
    clock.now += 0.1
    state.dispatch(clock.now)
    assert [run_of(d) for d in other.frames("delivery")] == [blocker.run_id]


# ---------------------------------------------------------------------- end to end


async def test_ten_thousand_runs_submitted_at_once_are_all_acked_by_one_harness(
    tmp_path: Path,
) -> None:
    total = 10_000
    with trio.fail_after(240):
        async with running_server(heartbeat_s=1000) as server:
            run_ids = [(await server.submit_run(f"run {n}")) for n in range(total)]
            async with running_harness(server, tmp_path, dry_run=True):
                await server.wait_until(lambda s: s.counts["accepted"] == total)
                (conn,) = server.state.connections.values()
    state = server.state
    assert {state.runs[r].accepted_by for r in run_ids} == {conn.token}
    assert all(state.runs[r].ack_statuses[0] == 200 for r in run_ids)
    # One connection throughout: never dropped as "not reading".
    assert state.total_connects == 1
    assert [e.kind for e in state.connection_events] == ["connect", "disconnect"]
    assert 0 < conn.max_in_flight <= DELIVERY_WINDOW


async def test_a_connection_whose_writer_is_gone_does_not_hang_dispatch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A harness killed with runs waiting: its outbox's reader closes before the
    connection is removed. Dispatch must let go of it, not offer the same runs to it
    for ever (the soak saw the server spin at 100% CPU, answering nothing)."""
    state, clock = model()
    peer = Peer(state, state.pair("m").token)
    peer.inbox.close()  # the writer task ended: sends now fail
    runs = [state.add_run(f"r{n}") for n in range(5)]
    sends = 0
    real_send = Connection.send

    def counted_send(conn: Connection, text: str) -> bool:
        # A hang would be an endless loop of failed sends: fail the test instead.
        nonlocal sends
        sends += 1
        if sends > 100:
            raise AssertionError("dispatch keeps offering runs to a dead connection")
        return real_send(conn, text)

    monkeypatch.setattr(Connection, "send", counted_send)
    state.dispatch(clock.now)
    assert peer.conn.cancel_scope.cancel_called
    assert all(state.runs[run.run_id].state == "queued" for run in runs)
