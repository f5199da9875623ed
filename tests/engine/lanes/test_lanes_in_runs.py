"""§4 scheduling through the whole harness: lanes, the limit, oldest first."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from tests.kits.harness import busy_and_queued, finished, gated_harness, start_run

pytestmark = pytest.mark.protocol("§4")


async def test_one_lane_runs_in_order_and_never_overlaps(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with gated_harness(tmp_path, concurrency=4) as (gate, running):
            server = running.server
            turns = [await server.submit_run(f"turn {n}", conversation_id="C1")
                     for n in range(3)]
            await gate.wait_started(turns[0])
            await server.wait_until(lambda s: all(s.runs[r].state == "accepted" for r in turns))
            await trio.testing.wait_all_tasks_blocked(0.05)
            stats = running.harness.scheduler.statistics()
            assert (stats.running, stats.queued) == (1, 2)  # four slots, but one lane
            assert gate.started == turns[:1]
            for index, run_id in enumerate(turns):
                await gate.wait_started(run_id)
                assert gate.running == 1
                await gate.release(run_id, f"answer {index}")
            await server.wait_until(finished(*turns))
            assert gate.started == turns
            assert gate.max_running == 1
            assert [server.run(r).reply for r in turns] == ["answer 0", "answer 1", "answer 2"]


async def test_lanes_overlap_up_to_the_limit_and_never_beyond(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with gated_harness(tmp_path, concurrency=3) as (gate, running):
            server = running.server
            runs = [await server.submit_run("work", conversation_id=f"C{n}") for n in range(6)]
            await gate.wait(lambda g: g.running == 3)
            await server.wait_until(lambda s: all(s.runs[r].state != "queued" for r in runs))
            await trio.testing.wait_all_tasks_blocked(0.05)
            assert gate.running == 3  # three lanes free and waiting, but no fourth slot
            assert running.harness.scheduler.statistics().queued == 3
            for run_id in runs:
                await gate.wait_started(run_id)
                await gate.release(run_id)
            await server.wait_until(finished(*runs))
            assert gate.max_running == 3


async def test_oldest_accepted_free_lane_goes_first(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with gated_harness(tmp_path, concurrency=1) as (gate, running):
            server = running.server
            # Queued in this order while the only slot is busy:
            first, [a2, b1, c1] = await busy_and_queued(server, gate, "A", "B", "C")
            await gate.release(first)
            # The slot frees when A1's agent ends, while A's lane is still busy
            # reporting it: B1 is the oldest run on a free lane.
            await gate.wait_started(b1)
            await server.wait_until(finished(first))
            await running.harness.wait_until(lambda h: first not in h.held)
            # Now lanes A and C are both free: A2 was accepted before C1.
            await gate.release(b1)
            await gate.wait_started(a2)
            await gate.release(a2)
            await gate.wait_started(c1)
            await gate.release(c1)
            await server.wait_until(finished(first, a2, b1, c1))
            assert gate.started == [first, b1, a2, c1]


async def test_a_busy_lane_does_not_hold_up_the_lanes_behind_it(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with gated_harness(tmp_path, concurrency=2) as (gate, running):
            server = running.server
            long_a = await start_run(server, gate, "long job", conversation_id="A")
            a2 = await server.submit_run("A again", conversation_id="A")
            b1 = await server.submit_run("quick question", conversation_id="B")
            # B starts in the second slot although A2 was accepted first.
            await gate.wait_started(b1)
            assert a2 not in gate.started
            await gate.release(b1)
            await gate.release(long_a)
            await gate.wait_started(a2)
            await gate.release(a2)
            await server.wait_until(finished(long_a, a2, b1))
