"""The lane scheduler (docs/protocol.md §4): the pure LaneQueue, then the trio Scheduler."""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from prohost.engine.lanes.lanequeue import LaneQueue
from prohost.engine.lanes.scheduler import (
    MAX_CONCURRENCY,
    DrainingError,
    QueueFullError,
    Scheduler,
    SchedulerStatistics,
    Slot,
)
from tests.kits.lanes import until_idle

pytestmark = pytest.mark.protocol("§4")

# ---------------------------------------------------------------------------
# LaneQueue: the data structure on its own.
# ---------------------------------------------------------------------------


def pop_key(q: LaneQueue[str]) -> str | None:
    ready = q.pop_ready()
    return None if ready is None else ready.key


def queue_of(*keys: str) -> LaneQueue[str]:
    """A LaneQueue with ``keys`` pushed in order, each on the lane its first letter
    names and with its own name in capitals as the item ("a1": lane "A", item "A1")."""
    q: LaneQueue[str] = LaneQueue()
    for key in keys:
        q.push(key, key[0].upper(), key.upper())
    return q


def test_one_lane_runs_in_push_order_and_never_overlaps() -> None:
    q = queue_of("a1", "a2", "a3")
    ready = q.pop_ready()
    assert ready is not None and (ready.key, ready.lane, ready.item) == ("a1", "A", "A1")
    # Lane busy: its next item must wait even though it is the oldest queued.
    assert q.pop_ready() is None
    q.release("A")
    assert pop_key(q) == "a2"
    assert q.pop_ready() is None
    q.release("A")
    assert pop_key(q) == "a3"
    q.release("A")
    assert q.pop_ready() is None
    assert (q.queued, q.running) == (0, 0)


def test_oldest_accepted_first_among_free_lanes() -> None:
    q = queue_of("c1", "a1", "b1", "a2", "b2")
    assert [pop_key(q) for _ in range(3)] == ["c1", "a1", "b1"]
    # B finishes before A: b2 (younger than a2) goes first only because A is busy.
    q.release("B")
    assert pop_key(q) == "b2"
    q.release("A")
    assert pop_key(q) == "a2"


def test_release_order_does_not_beat_accept_order() -> None:
    q = queue_of("a1", "b1", "a2", "b2")
    assert [pop_key(q), pop_key(q)] == ["a1", "b1"]
    # Both lanes free up; B freed first, but a2 was accepted before b2.
    q.release("B")
    q.release("A")
    assert [pop_key(q), pop_key(q)] == ["a2", "b2"]


def test_busy_lane_does_not_hold_up_later_lanes() -> None:
    q = queue_of("a1", "a2", "a3", "a4", "a5", "a6", "b1", "c1")
    assert pop_key(q) == "a1"
    # a2..a6 are older than b1 and c1 but stuck behind a1.
    assert pop_key(q) == "b1"
    assert pop_key(q) == "c1"
    assert q.pop_ready() is None
    assert (q.queued, q.running) == (5, 3)


def test_push_onto_a_busy_lane_waits_for_release() -> None:
    q: LaneQueue[int] = LaneQueue()
    q.push("a1", "A", 0)
    assert pop_key(q) == "a1"
    q.push("a2", "A", 0)
    q.push("b1", "B", 0)
    assert pop_key(q) == "b1"
    assert q.pop_ready() is None
    q.release("A")
    assert pop_key(q) == "a2"


@pytest.mark.protocol("§6")
def test_remove_queued_items() -> None:
    q = queue_of("a1", "b1", "a2", "a3")
    assert "a2" in q
    assert q.remove("a2") == "A2"
    assert "a2" not in q
    assert q.remove("a2") is None
    assert q.remove("nope") is None
    assert q.queued == 3
    # The head of a free lane: the lane's heap entry must be repaired so that
    # b1 (older than a3) still goes before a3.
    assert q.remove("a1") == "A1"
    assert [pop_key(q), pop_key(q)] == ["b1", "a3"]
    assert (q.queued, q.running) == (0, 2)


def test_remove_refuses_a_running_item_and_contains_covers_it() -> None:
    q: LaneQueue[int] = LaneQueue()
    q.push("a1", "A", 1)
    assert pop_key(q) == "a1"
    assert "a1" in q
    assert q.remove("a1") is None
    assert q.running == 1
    with pytest.raises(ValueError, match="already"):
        q.push("a1", "A", 2)
    q.release("A")
    assert "a1" not in q
    q.push("a1", "A", 3)  # a finished key may come back (a redelivery after settle)


def test_remove_every_item_of_a_lane_then_reuse_it() -> None:
    q = queue_of("a1", "a2", "b1")
    q.remove("a1")
    q.remove("a2")
    q.push("a3", "A", "A3")
    assert [pop_key(q), pop_key(q), q.pop_ready()] == ["b1", "a3", None]


@pytest.mark.protocol("§9")
def test_drain_returns_queued_items_in_accept_order_and_keeps_running_ones() -> None:
    q = queue_of("a1", "b1", "a2", "c1", "b2")
    assert pop_key(q) == "a1"
    q.remove("c1")
    assert q.drain() == [("b1", "B1"), ("a2", "A2"), ("b2", "B2")]
    assert (q.queued, q.running) == (0, 1)
    assert q.pop_ready() is None
    q.release("A")
    assert q.pop_ready() is None
    assert (q.queued, q.running) == (0, 0)


def test_release_of_a_free_lane_is_an_error() -> None:
    q: LaneQueue[int] = LaneQueue()
    with pytest.raises(KeyError):
        q.release("A")


def naive_order(ops: list[tuple[str, str, str]]) -> list[str]:
    """The TypeScript original's rule, as a reference model: first pending item
    whose lane is free."""
    pending: list[tuple[str, str]] = []
    busy: set[str] = set()
    started: list[str] = []
    for op, key, lane in ops:
        if op == "push":
            pending.append((key, lane))
        elif op == "remove":
            pending = [p for p in pending if p[0] != key]
        elif op == "pop":
            for i, (k, lane_) in enumerate(pending):
                if lane_ not in busy:
                    busy.add(lane_)
                    del pending[i]
                    started.append(k)
                    break
        else:
            busy.discard(lane)
    return started


def test_matches_the_naive_scan_on_random_workloads() -> None:
    """The heap must agree, operation for operation, with the O(n) scan it replaces."""
    rng = random.Random(1234)
    for _ in range(200):
        q: LaneQueue[None] = LaneQueue()
        ops: list[tuple[str, str, str]] = []
        started: list[str] = []
        queued: list[str] = []
        running: dict[str, str] = {}
        lanes = [f"L{i}" for i in range(rng.randint(1, 6))]
        for n in range(rng.randint(1, 60)):
            roll = rng.random()
            if roll < 0.45:
                key, lane = f"k{n}", rng.choice(lanes)
                q.push(key, lane, None)
                queued.append(key)
                ops.append(("push", key, lane))
            elif roll < 0.55 and queued:
                key = rng.choice(queued)
                q.remove(key)
                queued.remove(key)
                ops.append(("remove", key, ""))
            elif roll < 0.8:
                ready = q.pop_ready()
                ops.append(("pop", "", ""))
                if ready is not None:
                    started.append(ready.key)
                    queued.remove(ready.key)
                    running[ready.lane] = ready.key
            elif running:
                lane = rng.choice(sorted(running))
                del running[lane]
                q.release(lane)
                ops.append(("release", "", lane))
            assert (q.queued, q.running) == (len(queued), len(running))
        assert started == naive_order(ops)


# ---------------------------------------------------------------------------
# Scheduler: the trio driver.
# ---------------------------------------------------------------------------


class Harness:
    """Work whose finish each test controls, recording what started and how many overlap."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.finished: list[str] = []
        self.gates: dict[str, trio.Event] = {}
        self.running: set[str] = set()
        self.max_running = 0
        self.lane_of: dict[str, str] = {}
        self.lane_overlap = False
        self.fail: set[str] = set()

    def gate(self, key: str) -> trio.Event:
        return self.gates.setdefault(key, trio.Event())

    async def work(self, key: str, lane: str, slot: Slot) -> None:
        self.started.append(key)
        if any(self.lane_of[k] == lane for k in self.running):
            self.lane_overlap = True
        self.running.add(key)
        self.max_running = max(self.max_running, len(self.running))
        try:
            await self.gate(key).wait()
            if key in self.fail:
                raise RuntimeError(f"{key} broke")
        finally:
            self.running.discard(key)
            self.finished.append(key)

    def submit(self, sched: Scheduler[str], key: str, lane: str) -> None:
        self.lane_of[key] = lane
        sched.submit(key, lane, lane)

    def submit_all(self, sched: Scheduler[str], *items: tuple[str, str]) -> None:
        """Submit each (key, lane), in order."""
        for key, lane in items:
            self.submit(sched, key, lane)

    async def finish(self, *keys: str) -> None:
        for key in keys:
            self.gate(key).set()
        await trio.testing.wait_all_tasks_blocked()


@asynccontextmanager
async def running_scheduler(limit: int) -> AsyncIterator[tuple[Scheduler[str], Harness]]:
    harness = Harness()
    sched: Scheduler[str] = Scheduler(limit, harness.work)
    async with trio.open_nursery() as nursery:
        await nursery.start(sched.run)
        yield sched, harness
        nursery.cancel_scope.cancel()


async def test_one_lane_never_overlaps_and_keeps_order() -> None:
    with trio.fail_after(5):
        async with running_scheduler(4) as (sched, h):
            for i in range(4):
                h.submit(sched, f"a{i}", "conv:A")
            await trio.testing.wait_all_tasks_blocked()
            assert h.started == ["a0"]
            for i in range(4):
                await h.finish(f"a{i}")
            assert h.started == ["a0", "a1", "a2", "a3"]
            assert h.max_running == 1
            assert not h.lane_overlap


async def test_lanes_overlap_up_to_the_limit_and_never_beyond() -> None:
    with trio.fail_after(5):
        async with running_scheduler(3) as (sched, h):
            keys = [f"r{i}" for i in range(10)]
            for key in keys:
                h.submit(sched, key, f"lane:{key}")
            await trio.testing.wait_all_tasks_blocked()
            assert set(h.started) == set(keys[:3])
            assert sched.statistics() == SchedulerStatistics(
                limit=3, running=3, queued=7, draining=False
            )
            for key in keys:
                await h.finish(key)
            assert h.started[3:] == keys[3:]
            assert h.max_running == 3
            assert sched.statistics().running == 0


async def test_oldest_free_lane_first_when_a_slot_frees() -> None:
    with trio.fail_after(5):
        async with running_scheduler(2) as (sched, h):
            h.submit_all(sched, ("a1", "A"), ("b1", "B"), ("c1", "C"), ("a2", "A"), ("d1", "D"))
            await trio.testing.wait_all_tasks_blocked()
            assert set(h.started) == {"a1", "b1"}
            # A's slot frees: a2 is now free to start but c1 is older.
            await h.finish("a1")
            assert h.started[2:] == ["c1"]
            await h.finish("b1")
            assert h.started[2:] == ["c1", "a2"]
            await h.finish("c1", "a2", "d1")
            assert h.started[2:] == ["c1", "a2", "d1"]


async def test_busy_lane_does_not_hold_up_others() -> None:
    with trio.fail_after(5):
        async with running_scheduler(2) as (sched, h):
            h.submit(sched, "long", "A")
            for i in range(3):
                h.submit(sched, f"a{i}", "A")
            h.submit_all(sched, ("quick1", "B"), ("quick2", "C"))
            await trio.testing.wait_all_tasks_blocked()
            # Started in one dispatch pass: trio may run the two tasks in either order.
            assert set(h.started) == {"long", "quick1"}
            await h.finish("quick1")
            assert h.started[2:] == ["quick2"]
            assert "a0" not in h.started
            await h.finish("quick2", "long")
            assert h.started[-1] == "a0"
            assert not h.lane_overlap


@pytest.mark.protocol("§6")
async def test_remove_a_queued_item() -> None:
    with trio.fail_after(5):
        async with running_scheduler(1) as (sched, h):
            h.submit_all(sched, ("a1", "A"), ("b1", "B"), ("c1", "C"))
            await trio.testing.wait_all_tasks_blocked()
            assert sched.remove("b1") == "B"
            assert sched.remove("a1") is None  # running: not the scheduler's to stop
            assert "b1" not in sched
            assert "a1" in sched
            assert sched.statistics().queued == 1
            await h.finish("a1", "c1")
            assert h.started == ["a1", "c1"]


@pytest.mark.protocol("§9")
async def test_drain_stops_new_work_and_returns_the_queue() -> None:
    with trio.fail_after(5):
        async with running_scheduler(2) as (sched, h):
            h.submit_all(sched, ("a1", "A"), ("b1", "B"), ("a2", "A"), ("c1", "C"))
            await trio.testing.wait_all_tasks_blocked()
            assert sched.drain() == [("a2", "A"), ("c1", "C")]
            assert sched.statistics() == SchedulerStatistics(
                limit=2, running=2, queued=0, draining=True
            )
            with pytest.raises(DrainingError):
                sched.submit("d1", "D", "D")
            # A freed slot must not start anything while draining.
            await h.finish("a1")
            assert sorted(h.started) == ["a1", "b1"]
            await h.finish("b1")
            await until_idle(sched)
            assert h.finished == ["a1", "b1"]


async def test_raising_work_does_not_wedge_its_lane_or_kill_the_scheduler(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with trio.fail_after(5):
        async with running_scheduler(1) as (sched, h):
            h.fail.add("a1")
            h.submit_all(sched, ("a1", "A"), ("a2", "A"))
            with caplog.at_level(logging.ERROR, logger="prohost.scheduler"):
                await h.finish("a1")
            assert h.started == ["a1", "a2"]
            assert "a1 broke" in caplog.text
            await h.finish("a2")
            await until_idle(sched)


async def test_submit_before_run_starts_is_picked_up() -> None:
    with trio.fail_after(5):
        h = Harness()
        sched: Scheduler[str] = Scheduler(1, h.work)
        h.submit(sched, "a1", "A")
        async with trio.open_nursery() as nursery:
            await nursery.start(sched.run)
            await trio.testing.wait_all_tasks_blocked()
            assert h.started == ["a1"]
            await h.finish("a1")
            await until_idle(sched)
            nursery.cancel_scope.cancel()


async def test_cancelling_run_cancels_running_work_and_keeps_the_queue() -> None:
    with trio.fail_after(5):
        h = Harness()
        sched: Scheduler[str] = Scheduler(1, h.work)
        async with trio.open_nursery() as nursery:
            await nursery.start(sched.run)
            h.submit_all(sched, ("a1", "A"), ("b1", "B"))
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        assert h.finished == ["a1"]  # cancelled, and its finally ran
        assert h.started == ["a1"]
        assert sched.drain() == [("b1", "B")]


@pytest.mark.parametrize("limit", [0, MAX_CONCURRENCY + 1])
def test_limit_is_bounded(limit: int) -> None:
    async def work(key: str, item: None, slot: Slot) -> None:
        raise AssertionError("never called")

    with pytest.raises(ValueError, match="limit"):
        Scheduler(limit, work)


# ---------------------------------------------------------------------------
# The channel in, the slot limiter, and holding a lane.
# ---------------------------------------------------------------------------


async def test_items_still_in_the_channel_can_be_removed_and_drained() -> None:
    with trio.fail_after(5):
        h = Harness()
        sched: Scheduler[str] = Scheduler(1, h.work)
        # Not running yet: everything waits in the channel.
        h.submit_all(sched, ("a1", "A"), ("b1", "B"), ("c1", "C"))
        assert "b1" in sched and sched.statistics().queued == 3
        with pytest.raises(ValueError, match="already queued"):
            sched.submit("b1", "B", "B")
        assert sched.remove("b1") == "B"
        assert "b1" not in sched
        h.submit(sched, "b1", "B")  # the same key again, after its removal
        async with trio.open_nursery() as nursery:
            await nursery.start(sched.run)
            await trio.testing.wait_all_tasks_blocked()
            assert h.started == ["a1"]
            # c1 is in the lanes now, b1 (submitted again) behind it.
            assert sched.drain() == [("c1", "C"), ("b1", "B")]
            await h.finish("a1")
            await until_idle(sched)
            nursery.cancel_scope.cancel()
        assert h.started == ["a1"]


@pytest.mark.protocol("§3")
async def test_the_queue_cap_refuses_rather_than_blocks() -> None:
    h = Harness()
    sched: Scheduler[str] = Scheduler(1, h.work, queue_cap=2)
    h.submit_all(sched, ("a1", "A"), ("a2", "A"))
    with pytest.raises(QueueFullError, match="'a3' was not queued"):
        sched.submit("a3", "A", "A")
    assert "a3" not in sched and sched.statistics().queued == 2


async def test_a_released_slot_starts_another_lane_while_the_lane_stays_busy() -> None:
    with trio.fail_after(5):
        released: dict[str, trio.Event] = {}
        started: list[str] = []

        async def work(key: str, item: str, slot: Slot) -> None:
            started.append(key)
            await h.gate(key).wait()
            # The agent is done; the report would take a while.
            slot.release()
            slot.release()  # idempotent
            assert not slot.held
            await released.setdefault(key, trio.Event()).wait()

        h = Harness()
        sched: Scheduler[str] = Scheduler(1, work)
        async with trio.open_nursery() as nursery:
            await nursery.start(sched.run)
            for key, lane in [("a1", "A"), ("a2", "A"), ("b1", "B")]:
                sched.submit(key, lane, lane)
            await trio.testing.wait_all_tasks_blocked()
            assert started == ["a1"]
            await h.finish("a1")
            # a2 is older than b1, but lane A is still busy: b1 gets the slot.
            assert started == ["a1", "b1"]
            assert sched.statistics() == SchedulerStatistics(
                limit=1, running=1, queued=1, draining=False, reporting=1)
            released.setdefault("a1", trio.Event()).set()
            await trio.testing.wait_all_tasks_blocked()
            assert started == ["a1", "b1"]  # lane A is free, but b1 holds the slot
            await h.finish("b1")
            assert started == ["a1", "b1", "a2"]
            nursery.cancel_scope.cancel()


async def test_holding_a_lane_waits_for_its_run_and_keeps_the_next_from_starting() -> None:
    with trio.fail_after(5):
        async with running_scheduler(2) as (sched, h):
            h.submit(sched, "a1", "A")
            await trio.testing.wait_all_tasks_blocked()
            holding = trio.Event()
            let_go = trio.Event()

            async def hold() -> None:
                async with sched.holding("A"):
                    holding.set()
                    await let_go.wait()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(hold)
                await trio.testing.wait_all_tasks_blocked()
                assert not holding.is_set()  # a1 runs on A
                h.submit_all(sched, ("a2", "A"), ("b1", "B"))
                await h.finish("a1")
                assert holding.is_set()
                # Held: a2 waits although a slot is free; other lanes go on.
                assert h.started == ["a1", "b1"]
                assert sched.statistics().held_lanes == 1
                let_go.set()
            await trio.testing.wait_all_tasks_blocked()
            assert h.started == ["a1", "b1", "a2"]
            assert sched.statistics().held_lanes == 0
            await h.finish("a2", "b1")
            await until_idle(sched)


async def test_a_cancelled_hold_holds_nothing() -> None:
    with trio.fail_after(5):
        async with running_scheduler(1) as (sched, h):
            h.submit(sched, "a1", "A")
            await trio.testing.wait_all_tasks_blocked()
            # The hold waits for a1; cancelled once it waits (no real time passes).
            waiting = trio.CancelScope()

            async def hold() -> None:
                with waiting:
                    async with sched.holding("A"):
                        raise AssertionError("a1 is running on A")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(hold)
                await trio.testing.wait_all_tasks_blocked()
                waiting.cancel()
            assert waiting.cancelled_caught
            h.submit(sched, "a2", "A")
            await h.finish("a1")
            assert h.started == ["a1", "a2"]
            await h.finish("a2")


# ---------------------------------------------------------------------------
# Runs that only need reporting: the scheduler's other kind of item.
# ---------------------------------------------------------------------------


async def test_a_settled_item_takes_no_slot_but_waits_for_its_lane() -> None:
    """Every slot is taken and lane A is busy: a report for B starts at once, one
    for A only once A's run has ended, and neither is counted as queued."""
    with trio.fail_after(5):
        async with running_scheduler(1) as (sched, h):
            h.submit(sched, "a1", "A")
            await trio.testing.wait_all_tasks_blocked()
            h.lane_of.update(ra="A", rb="B")
            assert sched.settle("ra", "A", "A") and sched.settle("rb", "B", "B")
            await trio.testing.wait_all_tasks_blocked()
            assert h.started == ["a1", "rb"]  # no slot was free: rb needs none
            figures = sched.statistics()
            assert (figures.running, figures.queued, figures.waiting_reports) == (1, 0, 1)
            assert figures.reporting == 2  # rb running, ra waiting for A
            await h.finish("a1")
            assert h.started == ["a1", "rb", "ra"]
            assert not h.lane_overlap
            await h.finish("ra", "rb")
            await until_idle(sched)


@pytest.mark.protocol("§6")
async def test_a_queued_run_settled_keeps_its_place_in_its_lane() -> None:
    """Lane A: a1 runs, a2 and a3 wait. a3 is cancelled (settled): it is reported
    in its turn, after a2, and before a4, accepted after it; a settled running run
    is refused (its own work reports it)."""
    with trio.fail_after(5):
        async with running_scheduler(2) as (sched, h):
            h.submit_all(sched, ("a1", "A"), ("a2", "A"), ("a3", "A"), ("a4", "A"))
            await trio.testing.wait_all_tasks_blocked()
            assert not sched.settle("a1", "A", "report of a1")
            assert sched.settle("a3", "A", "report of a3")
            assert sched.statistics().queued == 2
            for key in ("a1", "a2", "a3"):
                await h.finish(key)
            assert h.started == ["a1", "a2", "a3", "a4"]
            await h.finish("a4")
            await until_idle(sched)


@pytest.mark.protocol("§9")
async def test_a_drain_hands_back_the_runs_and_keeps_the_reports() -> None:
    """Settled items, in the lanes or still on their way in, are still reported
    after a drain; only the runs are handed back, in accept order."""
    with trio.fail_after(5):
        h = Harness()
        sched: Scheduler[str] = Scheduler(1, h.work)
        h.submit_all(sched, ("a1", "A"), ("a2", "A"), ("b1", "B"))
        assert sched.settle("b1", "B", "report of b1")  # still in the channel
        async with trio.open_nursery() as nursery:
            await nursery.start(sched.run)
            await trio.testing.wait_all_tasks_blocked()
            assert h.started in (["a1", "b1"], ["b1", "a1"])
            h.lane_of["c1"] = "C"
            assert sched.settle("c1", "A", "report of c1")  # behind a2 on lane A
            assert sched.drain() == [("a2", "A")]
            await h.finish("a1", "b1")
            assert h.started[2:] == ["c1"]
            await h.finish("c1")
            await until_idle(sched)
            nursery.cancel_scope.cancel()


def test_lane_queue_moves_a_ready_lane_to_the_heap_of_its_head_s_kind() -> None:
    """The pure queue: a ready lane whose head is made slotless pops without a slot;
    with a run at its head again (the report removed), it waits for one."""
    q = queue_of("a1", "a2", "b1")
    assert q.make_slotless("a1", "report")
    assert q.pop_ready(slot_free=False) is not None  # a1's report, no slot needed
    assert q.pop_ready(slot_free=False) is None  # b1 needs a slot
    q.release("A")
    assert q.make_slotless("a2", "report")
    q.remove("a2")
    assert q.pop_ready(slot_free=False) is None
    assert [pop_key(q), pop_key(q), pop_key(q)] == ["b1", None, None]
    assert (q.queued, q.queued_slotless) == (0, 0)
