#!/usr/bin/env python3
"""What confinement costs end to end: ``--sandbox auto`` against ``off``, alternated.

Usage: ``.venv/bin/python scripts/bench_sandbox.py [--rounds N] [--runs N]
[--probes N] [--rest-samples N] [--floor-spawns N] [--beside] [TREE ...]``

Each round runs ``bench_e2e.py``'s throughput phase (2: ``--runs`` runs submitted
before the harness starts, 16 at a time, ``--exec cat``; runs/s and the harness's
CPU per run) and its latency-at-rest phase (6: delivery → agent spawned, one run at
a time), once with ``--sandbox off`` and once with ``auto``, alternating in the same
process so that drift on a shared machine hits both alike. With several checkouts
(a change's before and after), ``auto`` runs in each, every round (the harness is
``python -m prohost`` started in that checkout, which imports from its working
directory first); ``off`` runs in the first. Prints each round and, per checkout,
the medians' ratios against the targets (harness CPU per run ≤ 1.2×, runs/s ≥
0.8×, delivery → spawned at rest ≤ 2×) with the spread of the rounds' own ratios.

Each round first measures the spawn floor in the first checkout
(``bench_spawn_floor.py``: ``sh -c cat`` 16 at a time bare, under prohost's
bubblewrap command line; no harness), so the report shows what runs/s any harness
starting one bubblewrap per run can reach here: the floors' own ratio, and, since
with agents as cheap as ``cat`` the machine's CPU bounds runs/s, ``off``'s machine
CPU per run over that plus what bubblewrap adds to a spawn's. Each mode's runs/s is
also given against its floor (``off``: bare; ``auto``: bubblewrap), as
``bench_e2e.py`` gives its end-to-end runs/s.

With ``--beside``, each round also runs ``off`` with bubblewrap's load beside it
(``bench_spawn_floor.py --beside``, at the round's ``auto`` runs/s of the first
checkout): bubblewrap's kernel work slows everything on the machine, the
harness's own code included, so ``auto`` against that tells what the harness
itself adds from what the busier machine costs it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
from functools import partial
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_e2e

#: The spawn floor, run as a process of its own.
FLOOR_SCRIPT = Path(__file__).resolve().parent / "bench_spawn_floor.py"

TARGETS = {"cpu_ms_per_run": ("<=", 1.2), "runs_per_s": (">=", 0.8),
           "spawned_p50_ms": ("<=", 2.0)}


async def one(mode: str, runs: int, probes: int, samples: int) -> dict[str, float]:
    """One mode's figures, with the harness started with ``--sandbox mode``."""
    plain = bench_e2e.harness_argv

    def argv(exec_command: str, concurrency: int = bench_e2e.CONCURRENCY) -> list[str]:
        return [*plain(exec_command, concurrency), "--sandbox", mode]

    bench_e2e.harness_argv = argv
    try:
        with bench_e2e.bench_folder(f"sandbox-{mode}", keep=False) as tmp:
            e2e = await bench_e2e.throughput_and_acks(tmp, runs, probes)
            rest = await bench_e2e.latency_at_rest(tmp, samples)
    finally:
        bench_e2e.harness_argv = plain
    return {"runs_per_s": e2e["runs_per_s"], "cpu_ms_per_run": e2e["cpu_ms_per_run"],
            "machine_ms_per_run": e2e["cpu_ms_per_run_of"]["machine"],
            "spawned_p50_ms": statistics.median(rest["spawned"]) * 1e3}


#: The spawn floor's loads (bench_spawn_floor.py), in its order.
LOADS = ("bare", "bwrap")


async def spawn_floor(tree: str, spawns: int) -> dict[str, Any]:
    """``bench_spawn_floor.py``'s figures, run in ``tree`` (its prohost makes the
    command line) as a process of its own."""
    done = await trio.run_process([sys.executable, str(FLOOR_SCRIPT), "--json", "--spawns",
                                   str(spawns)], cwd=tree, capture_stdout=True)
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def floor_report(floors: list[dict[str, Any]], off_rows: list[dict[str, float]],
                 auto_rows: list[dict[str, float]]) -> None:
    """The floor's medians, the ceilings they set, and each mode's runs/s against
    its floor (see the module)."""
    def median(load: str, key: str) -> float:
        return statistics.median(floor[load][key] for floor in floors)

    bare = median("bare", "spawns_per_s")
    print(f"spawn floor, medians of {len(floors)} (load average "
          f"{min(f['load_average'] for f in floors):.1f}–"
          f"{max(f['load_average'] for f in floors):.1f}):")
    for load in LOADS:
        rate = median(load, "spawns_per_s")
        print(f"  {load:6s} {rate:7.1f} spawns/s ({rate / bare:.2f}× bare), machine CPU "
              f"{median(load, 'machine_cpu_ms'):5.2f} ms/spawn")
    off_machine = statistics.median(row["machine_ms_per_run"] for row in off_rows)
    print(f"  runs/s ceilings for auto against off, the machine's CPU bound (off: "
          f"{off_machine:.2f} ms of it per run end to end):")
    added = median("bwrap", "machine_cpu_ms") - median("bare", "machine_cpu_ms")
    print(f"    one bubblewrap per run, no harness cost: +{added:.2f} ms → "
          f"{off_machine / (off_machine + added):.2f}× (the floors' own ratio: "
          f"{median('bwrap', 'spawns_per_s') / bare:.2f}×)")
    for name, rows, load in (("off", off_rows, "bare"), ("auto", auto_rows, "bwrap")):
        rate = statistics.median(row["runs_per_s"] for row in rows)
        print(f"  {name:4s} {rate:7.1f} runs/s: {rate / median(load, 'spawns_per_s'):.2f}× "
              f"its floor ({load}); machine CPU "
              f"{statistics.median(row['machine_ms_per_run'] for row in rows):.2f} ms/run")


async def off_beside(args: argparse.Namespace, tree: str, rate: float) -> dict[str, float]:
    """``off``'s figures with bubblewrap's load beside it (``bench_spawn_floor.py
    --beside``: prohost's bubblewrap line running ``/bin/true`` at ``rate``, auto's
    runs/s of the round), so that the harness's CPU is taken on a machine as busy
    as ``auto`` makes it: ``auto`` against this is what the harness itself adds."""
    async with trio.open_nursery() as nursery:
        load = await nursery.start(partial(
            trio.run_process, [sys.executable, str(FLOOR_SCRIPT), "--beside", f"{rate:.1f}"],
            cwd=tree, check=False))
        try:
            return await one("off", args.runs, args.probes, args.rest_samples)
        finally:
            load.send_signal(signal.SIGTERM)  # its temporary folder removed on the way out


async def main_async(args: argparse.Namespace, trees: list[str]) -> None:
    modes = [("off", trees[0]), *(("auto", tree) for tree in trees)]
    found: dict[tuple[str, str], list[dict[str, float]]] = {mode: [] for mode in modes}
    floors: list[dict[str, Any]] = []
    beside: list[dict[str, float]] = []
    here = os.getcwd()
    for number in range(args.rounds):
        if args.floor_spawns:
            floor = await spawn_floor(trees[0], args.floor_spawns)
            floors.append(floor)
            print(f"round {number + 1} floor: " + ", ".join(
                f"{load} {floor[load]['spawns_per_s']:.1f} spawns/s "
                f"{floor[load]['machine_cpu_ms']:.2f} ms" for load in LOADS)
                + f" (load average {floor['load_average']:.1f})", flush=True)
        for mode, tree in modes:
            os.chdir(tree)
            try:
                got = await one(mode, args.runs, args.probes, args.rest_samples)
            finally:
                os.chdir(here)
            found[mode, tree].append(got)
            if args.beside and mode == "auto" and tree == trees[0]:
                os.chdir(tree)
                try:
                    beside.append(await off_beside(args, tree, got["runs_per_s"]))
                finally:
                    os.chdir(here)
                print(f"round {number + 1} off beside bubblewrap's load: harness CPU "
                      f"{beside[-1]['cpu_ms_per_run']:6.2f} ms/run", flush=True)
            name = f" {tree}" if len(trees) > 1 else ""
            print(f"round {number + 1} {mode:4s}{name}: {got['runs_per_s']:7.1f} runs/s, "
                  f"harness CPU {got['cpu_ms_per_run']:6.2f} ms/run, delivery→spawned p50 "
                  f"{got['spawned_p50_ms']:6.2f} ms, machine CPU "
                  f"{got['machine_ms_per_run']:6.2f} ms/run", flush=True)
    off_rows = found[modes[0]]
    for mode, tree in modes[1:]:
        rows = found[mode, tree]
        print(f"medians of {args.rounds} rounds, auto{' ' + tree if len(trees) > 1 else ''} "
              "against off (in brackets: the rounds' own ratios, lowest to highest):")
        for key, (sense, target) in TARGETS.items():
            off = statistics.median(row[key] for row in off_rows)
            auto = statistics.median(row[key] for row in rows)
            ratio = auto / off
            met = ratio <= target if sense == "<=" else ratio >= target
            each = sorted(a[key] / o[key] for a, o in zip(rows, off_rows, strict=True))
            print(f"  {key:15s} off {off:8.2f}  auto {auto:8.2f}  {ratio:5.2f}× "
                  f"[{each[0]:.2f}–{each[-1]:.2f}] "
                  f"(target {sense} {target}×: {'met' if met else 'NOT met'})")
        if floors:
            floor_report(floors, off_rows, rows)
    if beside:
        auto_rows = found[modes[1]]
        off_cpu = statistics.median(row["cpu_ms_per_run"] for row in beside)
        auto_cpu = statistics.median(row["cpu_ms_per_run"] for row in auto_rows)
        each = sorted(a["cpu_ms_per_run"] / o["cpu_ms_per_run"]
                      for a, o in zip(auto_rows, beside, strict=True))
        print(f"harness CPU per run, auto against off beside bubblewrap's load (what the "
              f"harness itself adds): off {off_cpu:.2f} ms, auto {auto_cpu:.2f} ms, "
              f"{auto_cpu / off_cpu:.2f}× [{each[0]:.2f}–{each[-1]:.2f}]")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--probes", type=int, default=30)
    parser.add_argument("--rest-samples", type=int, default=50)
    parser.add_argument("--floor-spawns", type=int, default=300,
                        help="spawns per load of the spawn floor each round (0: none)")
    parser.add_argument("--beside", action="store_true",
                        help="also run off with bubblewrap's load beside it, at auto's "
                        "runs/s, each round: the harness's CPU on a machine as busy")
    parser.add_argument("trees", nargs="*", default=["."],
                        help="checkouts whose harness runs auto, each every round "
                        "(the first also runs off); default: this one")
    args: Any = parser.parse_args()
    trees = [os.path.abspath(tree) for tree in args.trees]
    trio.run(partial(main_async, args, trees))


if __name__ == "__main__":
    main()
