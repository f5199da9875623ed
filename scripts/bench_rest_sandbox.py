"""Delivery → agent spawned at rest, ``--sandbox off`` against ``auto``, alternated.

Usage: ``.venv/bin/python scripts/bench_rest_sandbox.py [--rounds N] [--rest-samples N]
[TREE ...]``

Runs ``bench_e2e.py``'s latency-at-rest phase (6) only, ``--rounds`` times for each
mode, off and auto alternating in the same process, so that drift on a shared
machine hits both alike; prints each round's p50 of (a) delivery → spawned and the
median of the rounds' p50s per mode (issue 29's figure: auto within +10 % of off).
With several checkouts (a change's before and after), auto runs in each, every
round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from functools import partial
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_e2e


def with_sandbox(mode: str) -> Any:
    plain = bench_e2e.harness_argv

    def argv(exec_command: str, concurrency: int = bench_e2e.CONCURRENCY) -> list[str]:
        return [*plain(exec_command, concurrency), "--sandbox", mode]

    return plain, argv


async def one(mode: str, samples: int) -> dict[str, float]:
    plain, argv = with_sandbox(mode)
    bench_e2e.harness_argv = argv
    try:
        with bench_e2e.bench_folder(f"rest-{mode}", keep=False) as tmp:
            figures = await bench_e2e.latency_at_rest(tmp, samples)
    finally:
        bench_e2e.harness_argv = plain
    spawned = sorted(figures["spawned"])
    return {"p50": statistics.median(spawned) * 1e3,
            "p99": spawned[min(len(spawned) - 1, int(len(spawned) * 0.99))] * 1e3,
            "floor": statistics.median(figures["spawn_floor"]) * 1e3}


async def main_async(rounds: int, samples: int, trees: list[str]) -> None:
    """Each round: off, then auto once per tree (the harness is ``python -m
    prohost`` started in that tree, which imports from its working directory
    first), so a change's before and after are measured under the same load."""
    modes = [("off", trees[0]), *(("auto", tree) for tree in trees)]
    p50s: dict[tuple[str, str], list[float]] = {mode: [] for mode in modes}
    here = os.getcwd()
    for number in range(rounds):
        for mode, tree in modes:
            os.chdir(tree)
            try:
                got = await one(mode, samples)
            finally:
                os.chdir(here)
            p50s[mode, tree].append(got["p50"])
            print(f"round {number + 1} {mode:4s} {tree}: delivery→spawned p50 "
                  f"{got['p50']:6.2f} ms p99 {got['p99']:6.2f} ms "
                  f"(bare spawn p50 {got['floor']:5.2f} ms)", flush=True)
    off = statistics.median(p50s[modes[0]])
    print(f"median of {rounds} rounds' p50: off {off:.2f} ms")
    for mode, tree in modes[1:]:
        auto = statistics.median(p50s[mode, tree])
        pairs = [a / o for a, o in zip(p50s[mode, tree], p50s[modes[0]], strict=True)]
        print(f"  auto {tree}: {auto:.2f} ms, auto/off {auto / off:.3f} "
              f"(median of the rounds' ratios {statistics.median(pairs):.3f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rest-samples", type=int, default=50)
    parser.add_argument("trees", nargs="*", default=["."],
                        help="checkouts whose harness runs auto, each every round "
                        "(the first also runs off); default: this one")
    args = parser.parse_args()
    trees = [os.path.abspath(tree) for tree in args.trees]
    trio.run(partial(main_async, args.rounds, args.rest_samples, trees))


if __name__ == "__main__":
    main()
