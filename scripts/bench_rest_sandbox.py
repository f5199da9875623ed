"""Delivery → agent spawned at rest, ``--sandbox off`` against ``auto``, alternated.

Usage: ``.venv/bin/python scripts/bench_rest_sandbox.py [--rounds N] [--rest-samples N]``

Runs ``bench_e2e.py``'s latency-at-rest phase (6) only, ``--rounds`` times for each
mode, off and auto alternating in the same process, so that drift on a shared
machine hits both alike; prints each round's p50 of (a) delivery → spawned and the
median of the rounds' p50s per mode (issue 29's figure: auto within +10 % of off).
"""

from __future__ import annotations

import argparse
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


async def main_async(rounds: int, samples: int) -> None:
    p50s: dict[str, list[float]] = {"off": [], "auto": []}
    for number in range(rounds):
        for mode in ("off", "auto"):
            got = await one(mode, samples)
            p50s[mode].append(got["p50"])
            print(f"round {number + 1} {mode:4s}: delivery→spawned p50 {got['p50']:6.2f} ms "
                  f"p99 {got['p99']:6.2f} ms (bare spawn p50 {got['floor']:5.2f} ms)",
                  flush=True)
    off, auto = statistics.median(p50s["off"]), statistics.median(p50s["auto"])
    print(f"median of {rounds} rounds' p50: off {off:.2f} ms, auto {auto:.2f} ms, "
          f"auto/off {auto / off:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rest-samples", type=int, default=50)
    args = parser.parse_args()
    trio.run(partial(main_async, args.rounds, args.rest_samples))


if __name__ == "__main__":
    main()
