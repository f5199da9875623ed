#!/usr/bin/env python3
"""Benchmark the lane scheduler against the scan-the-queue design it replaced.

Usage: .venv/bin/python scripts/bench_scheduler.py [--runs N] [--lanes N] [--naive-skewed-runs N]

Two measurements, each with the same workload through both designs:

1. The real trio ``Scheduler`` (no-op work, concurrency 16) against a trio driver
   around a naive pending list: take the first run whose lane is free, splice it
   out (the TypeScript original's ``findIndex`` + ``splice``).
2. The data structures alone, ``LaneQueue`` against the naive list, driven by a
   plain loop that keeps 16 runs "running" and finishes the oldest each step. This
   isolates the O(log n) vs O(n) per dispatch from trio's per-task overhead.

Two workloads, all runs submitted up front (a backlog) and then worked off:
*uniform*, each run on a lane drawn uniformly (seeded) from ``--lanes``; and
*skewed*, lanes drawn with Zipf weights so a few busy conversations hold much of
the backlog. The scan only gets long when the runs at the front of the list are on
busy lanes, so uniform is the naive design's good case and skewed its bad one: there
it is O(n) per dispatch and O(n^2) overall, so it is run on the first
``--naive-skewed-runs`` runs only, and its rate is printed with the size it was
measured at. (The list's ``pop(i)`` is an O(n) memmove either way, but a fast one.)
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable

import trio

from prohost.engine.lanes.lanequeue import LaneQueue
from prohost.engine.lanes.scheduler import Scheduler

CONCURRENCY = 16

Workload = list[tuple[str, str]]


def uniform_workload(runs: int, lanes: int, seed: int = 42) -> Workload:
    """Every run on a lane drawn uniformly: each conversation has about runs/lanes turns."""
    rng = random.Random(seed)
    return [(f"run_{i:07d}", f"conv:{rng.randrange(lanes)}") for i in range(runs)]


def skewed_workload(runs: int, lanes: int, seed: int = 42) -> Workload:
    """Lanes drawn with Zipf weights 1/k: a few busy conversations hold most of the
    backlog (with 10,000 lanes the busiest has about 10% of the runs), the way one
    team channel out-talks the rest."""
    rng = random.Random(seed)
    weights = [1 / (k + 1) for k in range(lanes)]
    picks = rng.choices(range(lanes), weights=weights, k=runs)
    return [(f"run_{i:07d}", f"conv:{lane}") for i, lane in enumerate(picks)]


class NaiveScheduler:
    """The TypeScript original in trio: a pending list scanned on every dispatch."""

    def __init__(self, limit: int, work: Callable[[str, str], Awaitable[None]]) -> None:
        self.limit = limit
        self.work = work
        self.pending: list[tuple[str, str, str]] = []
        self.busy: set[str] = set()
        self.wake = trio.Event()
        self.idle = trio.Event()

    def submit(self, key: str, lane: str, item: str) -> None:
        self.pending.append((key, lane, item))
        self.wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                self.wake = trio.Event()
                while len(self.busy) < self.limit:
                    busy = self.busy
                    index = next(
                        (i for i, (_, lane, _) in enumerate(self.pending) if lane not in busy),
                        -1,
                    )
                    if index == -1:
                        break
                    key, lane, item = self.pending.pop(index)
                    busy.add(lane)
                    nursery.start_soon(self._execute, key, lane, item)
                await self.wake.wait()

    async def _execute(self, key: str, lane: str, item: str) -> None:
        try:
            await self.work(key, item)
        finally:
            self.busy.discard(lane)
            self.wake.set()
            if not self.busy and not self.pending:
                self.idle.set()

    async def wait_idle(self) -> None:
        if self.busy or self.pending:
            await self.idle.wait()


async def _noop(key: str, item: str) -> None:
    pass


def time_trio(kind: str, workload: Workload) -> float:
    """Seconds to submit and work off ``workload`` through a trio scheduler."""
    elapsed = 0.0

    async def drive() -> None:
        nonlocal elapsed
        # The whole backlog is submitted before the scheduler runs a step, so the
        # queue cap (10,000 in the harness) is raised to the workload's size.
        sched: Scheduler[str] | NaiveScheduler = (
            Scheduler(CONCURRENCY, _noop, queue_cap=len(workload))
            if kind == "heap"
            else NaiveScheduler(CONCURRENCY, _noop)
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(sched.run)
            start = time.perf_counter()
            for key, lane in workload:
                sched.submit(key, lane, lane)
            await sched.wait_idle()
            elapsed = time.perf_counter() - start
            nursery.cancel_scope.cancel()

    trio.run(drive)
    return elapsed


def time_lane_queue(workload: Workload) -> float:
    start = time.perf_counter()
    q: LaneQueue[str] = LaneQueue()
    for key, lane in workload:
        q.push(key, lane, lane)
    running: deque[str] = deque()
    done = 0
    while done < len(workload):
        while len(running) < CONCURRENCY and (ready := q.pop_ready()) is not None:
            running.append(ready[1])
        q.release(running.popleft())
        done += 1
    return time.perf_counter() - start


def time_naive_list(workload: Workload) -> float:
    start = time.perf_counter()
    pending: list[tuple[str, str, str]] = []
    for key, lane in workload:
        pending.append((key, lane, lane))
    busy: set[str] = set()
    running: deque[str] = deque()
    done = 0
    while done < len(workload):
        while len(running) < CONCURRENCY:
            index = next((i for i, (_, lane, _) in enumerate(pending) if lane not in busy), -1)
            if index == -1:
                break
            _, lane, _ = pending.pop(index)
            busy.add(lane)
            running.append(lane)
        busy.discard(running.popleft())
        done += 1
    return time.perf_counter() - start


def report(title: str, heap_n: int, heap_s: float, naive_n: int, naive_s: float) -> None:
    heap_rate = heap_n / heap_s
    naive_rate = naive_n / naive_s
    print(f"   {title}")
    print(f"     lane heap:  {heap_rate:>10,.0f} runs/s  ({heap_n:,} in {heap_s:.2f} s)")
    print(f"     naive scan: {naive_rate:>10,.0f} runs/s  ({naive_n:,} in {naive_s:.2f} s)")
    print(f"     ratio {heap_rate / naive_rate:,.1f}×")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--lanes", type=int, default=10_000)
    parser.add_argument(
        "--naive-skewed-runs",
        type=int,
        default=100_000,
        help="runs the naive design gets on the skewed workload (it is O(n^2) there)",
    )
    args = parser.parse_args()

    started = time.perf_counter()
    print(f"Python {platform.python_version()} ({platform.python_implementation()})")
    print(f"machine: {platform.platform()}, {os.cpu_count()} processors")
    print(f"trio {trio.__version__}; concurrency {CONCURRENCY}; no-op work; all queued up front")

    for name, make, naive_cap in (
        ("uniform", uniform_workload, args.runs),
        ("skewed (Zipf)", skewed_workload, args.naive_skewed_runs),
    ):
        full = make(args.runs, args.lanes)
        naive_n = min(naive_cap, args.runs)
        naive = full[:naive_n]
        busiest = Counter(lane for _, lane in full).most_common(1)[0][1]
        print()
        print(
            f"== {name}: {len(full):,} runs over {len({lane for _, lane in full}):,} lanes "
            f"(busiest lane {busiest:,} runs)"
        )
        if naive_n < len(full):
            print(
                f"   naive design scaled down to the first {naive_n:,} runs to finish in time; "
                "being O(n^2), its rate at the full size would be lower still, so the "
                "ratio understates the difference"
            )

        report(
            "trio Scheduler (submit all, then wait_idle):",
            len(full),
            time_trio("heap", full),
            naive_n,
            time_trio("naive", naive),
        )
        report(
            "data structure alone (push all, then pop/release with 16 in flight):",
            len(full),
            time_lane_queue(full),
            naive_n,
            time_naive_list(naive),
        )
    print()
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
