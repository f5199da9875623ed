#!/usr/bin/env python3
"""The spawn floor of a confined run, without the harness: ``sh -c cat`` fed 4 KiB,
16 at a time, bare and under the bubblewrap command line prohost builds.

Usage: ``.venv/bin/python scripts/bench_spawn_floor.py [--spawns N] [--json]``
(run from a checkout: its prohost makes the command line).

Two loads, one after the other, each ``--spawns`` spawns from trio as the harness
spawns (a worker thread's ``Popen``, the process reaped by trio), each the command
line :func:`prohost.engine.agent.spawn.command_line` gives:

- ``bare``: ``/bin/sh -c cat``, as ``--sandbox off`` spawns an agent;
- ``bwrap``: the same under bubblewrap with the options a plain ``--exec cat`` run
  gets (:func:`prohost.engine.run.confine.make`: the namespaces, the read-only
  machine, the hidden places, the socket filter passed as a descriptor), as
  ``--sandbox auto`` spawns it.

For each: spawns/s and the machine's CPU per spawn (``/proc/stat``, every CPU and
process: bubblewrap's cost is nearly all in the kernel, some of it in the kernel's
own threads, so the spawned trees' ``rusage`` misses it; other processes' load
counts too, so compare loads of one run). ``bwrap``/``bare`` is the spawn rate
any harness that starts one bubblewrap per run keeps here with agents as cheap as
``cat``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path.cwd()))

from prohost.engine.agent.spawn import command_line
from prohost.engine.run.confine import (
    RunConfinement,
    RunPlaces,
    Sandbox,
    command_paths,
    make,
)
from prohost.engine.sandbox import probe

CONCURRENCY = 16
LOADS = ("bare", "bwrap")
PAYLOAD = b"x" * 4096


def machine_busy_seconds() -> float:
    """CPU seconds every CPU has spent not idle (``/proc/stat``), since boot."""
    with open("/proc/stat") as stat:
        fields = [int(field) for field in stat.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def confinements(tmp: Path) -> list[RunConfinement]:
    """One confinement per worker (each spawn rewinds its socket filter's descriptor,
    so two spawns at once must not share one), as a plain ``--exec cat`` run's."""
    support = probe()
    if support.kind != "bwrap":
        raise SystemExit(f"no bubblewrap confinement here: {support.reason}")
    env = dict(os.environ)
    sandbox = Sandbox(mode="auto", support=support, home=tmp / "home",
                      user_home=Path(env.get("HOME", str(Path.home()))),
                      command=command_paths("cat", env))
    made = []
    for index in range(CONCURRENCY):
        places = RunPlaces(workdir=tmp / "work", worktrees=(), lane_folder=None,
                           scratch=tmp / "home" / "runs" / str(index), brain="plain", env=env)
        made.append(make(sandbox, support, places))
    return made


async def load(name: str, count: int, tmp: Path, made: list[RunConfinement]) -> dict[str, float]:
    """``count`` spawns of the load ``name``, 16 at a time."""
    left = count
    cwd = tmp / "work"

    async def worker(confined: RunConfinement) -> None:
        nonlocal left
        confinement = confined.confinement
        while left > 0:
            left -= 1
            fds: tuple[int, ...] = ()
            if name == "bare":
                argv = command_line(None, "cat", cwd)
            else:
                confinement.rewind()
                fds = confinement.pass_fds
                argv = command_line(confinement, "cat", cwd)
            result = await trio.run_process(argv, stdin=PAYLOAD, capture_stdout=True,
                                            cwd=cwd, pass_fds=fds, start_new_session=True)
            if result.stdout != PAYLOAD:
                raise RuntimeError(f"{name}: sh -c cat did not echo its stdin")

    busy, began = machine_busy_seconds(), time.perf_counter()
    async with trio.open_nursery() as nursery:
        for confined in made:
            nursery.start_soon(worker, confined)
    seconds, cpu = time.perf_counter() - began, machine_busy_seconds() - busy
    return {"spawns_per_s": count / seconds, "machine_cpu_ms": cpu * 1e3 / count}


async def floor(spawns: int) -> dict[str, Any]:
    """Each load's figures (see the module), and the load average when they began."""
    with tempfile.TemporaryDirectory(prefix="prohost-spawn-floor-") as folder:
        tmp = Path(folder)
        (tmp / "work").mkdir()
        made = confinements(tmp)
        try:
            found: dict[str, Any] = {"load_average": os.getloadavg()[0]}
            for name in LOADS:
                found[name] = await load(name, spawns, tmp, made)
            return found
        finally:
            for confined in made:
                confined.close()


async def beside(rate: float) -> None:
    """bubblewrap's load alone, until killed: prohost's bubblewrap line running
    ``/bin/true`` ``rate`` times a second (at most 16 at once), what confined runs
    add to the machine beside the harness (``bench_sandbox.py --beside``). SIGTERM
    ends it, its temporary folder removed."""
    with tempfile.TemporaryDirectory(prefix="prohost-beside-") as folder:
        tmp = Path(folder)
        (tmp / "work").mkdir()
        made = confinements(tmp)
        free = trio.Semaphore(CONCURRENCY)
        cwd = tmp / "work"

        async def spawn(confined: RunConfinement) -> None:
            try:
                confinement = confined.confinement
                confinement.rewind()
                await trio.run_process(command_line(confinement, "true", cwd), cwd=cwd,
                                       pass_fds=confinement.pass_fds, start_new_session=True)
            finally:
                made.append(confined)
                free.release()

        async def spawning() -> None:
            next_at = trio.current_time()
            async with trio.open_nursery() as nursery:
                while True:
                    await free.acquire()
                    next_at += 1 / rate
                    await trio.sleep_until(next_at)
                    nursery.start_soon(spawn, made.pop())

        try:
            with trio.open_signal_receiver(signal.SIGTERM) as signals:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(spawning)
                    async for _ in signals:
                        nursery.cancel_scope.cancel()
                        break
        finally:
            for confined in made:
                confined.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--spawns", type=int, default=300)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--beside", type=float, default=0, metavar="RATE",
                        help="no figures: spawn bubblewrap's line (/bin/true) RATE times "
                        "a second until killed, a load beside a harness")
    args = parser.parse_args()
    if args.beside:
        trio.run(beside, args.beside)
        return
    found = trio.run(floor, args.spawns)
    if args.json:
        print(json.dumps(found))
        return
    bare = found["bare"]
    for name in LOADS:
        got = found[name]
        ratio = got["spawns_per_s"] / bare["spawns_per_s"]
        print(f"{name:6s} {got['spawns_per_s']:7.1f} spawns/s ({ratio:.2f}× bare), "
              f"machine CPU {got['machine_cpu_ms']:5.2f} ms/spawn")


if __name__ == "__main__":
    main()
