"""The beacon (§2): status first, then heartbeats on time and statuses coalesced."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
import trio
import trio.testing

from prohost.engine.changes import Changes
from prohost.engine.link.beacon import STATUS_MIN_INTERVAL_S, Beacon
from prohost.engine.link.connection import Session
from prohost.engine.run.heldrun import HeldRun
from prohost.wire.intake import MAX_QUEUED_RUNS
from prohost.wire.protocol import Heartbeat, Hello, RunBeat, Status, decode, encode
from prohost.wire.runs import MAX_CONVERSATION_ID_BYTES, AgentRun


class RecordingSocket:
    """Stands in for the WebSocket under a Session: records what is sent, and when."""

    def __init__(self) -> None:
        self.sent: list[tuple[float, dict[str, Any]]] = []

    async def send_message(self, text: str) -> None:
        self.sent.append((trio.current_time(), json.loads(text)))


def status(active: int) -> Status:
    return Status(version="0", machine="m", brain="plain", concurrency=4, active=active,
                  queued=0, draining=False)


@pytest.mark.protocol("§1", "§2")
async def test_status_then_heartbeat_then_both_as_due(
    autojump_clock: trio.testing.MockClock,
) -> None:
    socket = RecordingSocket()
    now = {"active": 0}
    runs = [RunBeat(run_id="r1", state="running", lane="conv:C", started_at=1.5,
                    activity="Bash: ls"),
            RunBeat(run_id="r2", state="queued")]
    changes = Changes()
    beacon = Beacon(lambda: status(now["active"]), lambda: runs, changes)
    session = Session(socket, Hello(heartbeat_s=10), 1)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(beacon.serve, session)
        await trio.testing.wait_all_tasks_blocked()
        assert [m["type"] for _, m in socket.sent] == ["status", "heartbeat"]
        # A burst of changes: one status at once, then at most one per 250 ms,
        # and the last one sent says how things ended up.
        began = trio.current_time()
        for active in range(1, 20):
            now["active"] = active
            changes.notify()
            await trio.sleep(0.01)
        await trio.sleep(1)
        statuses = [(at, m) for at, m in socket.sent if m["type"] == "status"][1:]
        assert 2 <= len(statuses) <= 1 + (trio.current_time() - began) / STATUS_MIN_INTERVAL_S
        gaps = [later - earlier for (earlier, _), (later, _) in itertools.pairwise(statuses)]
        assert all(gap >= STATUS_MIN_INTERVAL_S for gap in gaps)
        assert statuses[-1][1]["active"] == 19
        # An unchanged status is not sent again.
        before = len(socket.sent)
        changes.notify()
        await trio.testing.wait_all_tasks_blocked()
        assert len(socket.sent) == before
        # Heartbeats every heartbeat_s, seq counting up, listing the runs.
        await trio.sleep(25)
        beats = [(at, m) for at, m in socket.sent if m["type"] == "heartbeat"]
        assert [m["seq"] for _, m in beats] == [1, 2, 3]
        assert beats[2][0] - beats[1][0] == 10
        assert beats[1][1]["runs"] == [{"run_id": "r1", "state": "running", "lane": "conv:C",
                                        "started_at": 1.5, "activity": "Bash: ls"},
                                       {"run_id": "r2", "state": "queued"}]
        nursery.cancel_scope.cancel()


@pytest.mark.protocol("§2", "§3")
async def test_a_full_queue_makes_a_heartbeat_far_below_4_mib() -> None:
    # 10,000 queued runs (the §3 cap) on 256-byte conversations: a heartbeat that
    # carried each one's lane would be over 3 MiB; only run_id and state go out.
    conversation = "c" * MAX_CONVERSATION_ID_BYTES
    held = [
        HeldRun.of(AgentRun(run_id=f"run_{n:06d}", completion_path="/v1/x", text="hi",
                         conversation_id=conversation))
        for n in range(MAX_QUEUED_RUNS)
    ]
    assert all(h.state == "queued" for h in held)
    beacon = Beacon(lambda: status(0), lambda: [h.beat() for h in held], Changes())
    text = encode(beacon.heartbeat())
    assert len(text.encode("utf-8")) < 1024 * 1024
    runs = json.loads(text)["runs"]
    assert len(runs) == MAX_QUEUED_RUNS
    assert runs[0] == {"run_id": "run_000000", "state": "queued"}
    # The reference server reads it as a heartbeat listing every run.
    decoded = decode(text)
    assert isinstance(decoded, Heartbeat) and len(decoded.runs) == MAX_QUEUED_RUNS
