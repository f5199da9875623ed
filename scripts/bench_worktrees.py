#!/usr/bin/env python3
"""Benchmark WorktreeManager.prepare against the git commands it wraps.

Usage: .venv/bin/python scripts/bench_worktrees.py [--files N] [--rounds N]

On one generated repository (``--files`` small files in nested folders, one
commit), in one run:

* **first turn**: ``prepare`` for a new lane (marker, ``rev-parse`` of the source,
  ``worktree prune``, ``worktree add``) against a plain
  ``git worktree add --detach <path> HEAD`` to a new path;
* **later turns**: ``prepare`` for a lane that already has its worktree (marker,
  one ``rev-parse``) against a plain ``git -C <worktree> status --porcelain``,
  the cheapest thing a harness could do to look at a worktree at all.

The two sides alternate within each round so drift (page cache, CPU clock) hits
both alike. Medians are printed, and the ratio prepare / plain.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from prohost.engine.repos.gitcmd import git_env
from prohost.engine.repos.worktrees import WorktreeManager

Timed = Callable[[], Awaitable[None]]


async def run_git(*args: str) -> None:
    await trio.run_process(
        ["git", *args],
        stdin=subprocess.DEVNULL,
        capture_stdout=True,
        capture_stderr=True,
        env=git_env(),
    )


def make_repo(path: Path, files: int) -> None:
    """``files`` files of a few hundred bytes, 50 to a folder, committed once."""
    for index in range(files):
        folder = path / f"pkg{index // 500}" / f"mod{index // 50}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"file{index}.py").write_text(f"# file {index}\n" + "x = 1\n" * 40)
    env = git_env()
    user = ["-c", "user.name=bench", "-c", "user.email=bench@example.invalid"]
    for args in (["init", "-q", "-b", "main"], ["add", "-A"],
                 [*user, "commit", "-q", "-m", "generated"]):
        subprocess.run(["git", "-C", str(path), *args], check=True, env=env)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu model unknown"


async def timed(action: Timed) -> float:
    start = time.perf_counter()
    await action()
    return time.perf_counter() - start


def describe(label: str, ours: list[float], plain: list[float], plain_label: str) -> str:
    a, b = statistics.median(ours), statistics.median(plain)
    return (
        f"{label:<12} prepare {a * 1000:8.2f} ms   {plain_label:<28} {b * 1000:8.2f} ms   "
        f"ratio {a / b:5.2f}x"
    )


async def bench(files: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="prohost-bench-") as tmp:
        base = Path(tmp)
        source = base / "app"
        source.mkdir()
        await trio.to_thread.run_sync(make_repo, source, files)
        manager = WorktreeManager(base / "home", [source])
        plain_root = base / "plain"

        # One warm-up of each, so the first measured round is not the cold cache's.
        await manager.prepare("conv:warm")
        await run_git("-C", str(source), "worktree", "add", "--detach",
                      str(plain_root / "warm"), "HEAD")

        create_ours: list[float] = []
        create_plain: list[float] = []
        for index in range(rounds):
            lane = f"conv:{index}"
            target = plain_root / f"wt{index}"

            async def ours(lane: str = lane) -> None:
                prepared = await manager.prepare(lane)
                assert prepared.failures == (), prepared.failures

            async def plain(target: Path = target) -> None:
                await run_git("-C", str(source), "worktree", "add", "--detach", str(target),
                              "HEAD")

            create_ours.append(await timed(ours))
            create_plain.append(await timed(plain))

        reuse_ours: list[float] = []
        reuse_plain: list[float] = []
        worktree = plain_root / "wt0"
        for _ in range(rounds * 4):

            async def again() -> None:
                await manager.prepare("conv:0")

            async def status() -> None:
                await run_git("-C", str(worktree), "status", "--porcelain")

            reuse_ours.append(await timed(again))
            reuse_plain.append(await timed(status))

        version = (await trio.run_process(["git", "--version"], capture_stdout=True)).stdout
        print(f"python {platform.python_version()} ({sys.implementation.name}), trio "
              f"{trio.__version__}, {version.decode().strip()}")
        print(f"machine: {platform.system()} {platform.release()} {platform.machine()}, "
              f"{os.cpu_count()} CPUs, {cpu_model()}")
        print(f"repo: {files} files; {rounds} creations and {rounds * 4} reuses of each kind")
        print(describe("first turn", create_ours, create_plain, "git worktree add"))
        print(describe("later turn", reuse_ours, reuse_plain, "git status --porcelain"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    trio.run(bench, args.files, args.rounds)


if __name__ == "__main__":
    main()
