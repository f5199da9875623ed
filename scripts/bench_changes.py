#!/usr/bin/env python3
"""Benchmark what a run changed (§7 ``changes``) against the git commands it is made of.

Usage: .venv/bin/python scripts/bench_changes.py [--files N] [--scale F] [--repeat N] [--keep]
                                                 [--git plain|confined|per-git]

One generated repository (``--files`` tracked files, 50,000 by default, one commit),
and in one run, for each case, from a clean worktree:

* **10 changed**: ten tracked files edited;
* **10,000 modified**: that many tracked files edited;
* **10,000 untracked**: that many new files;
* **one 50 MB file**: one new file of 50 MB of text.

(``--scale`` shrinks the counts and sizes, for a smoke run.) Each case times the
state taken before the change (``CheckoutReader.state``) and the comparison after
it (``CheckoutReader.compare``), against ``git status --porcelain=v2 -z`` plus ``git diff --numstat
-z`` on the same worktree at the same moment (the least a harness could do to learn
the same), and prints each as a ratio: the median of ``--repeat`` such pairs, each
pair run back to back, so that a machine busy with something else weighs on both
sides of a ratio alike. The store's object count (``git
count-objects -v``) is checked unchanged after each case: nothing is written.

``--git`` says where the git runs: ``plain`` (unconfined, with the harness's
overrides: where runs are not confined by bubblewrap), ``confined`` (the harness's
way where they are: one bubblewrap process for every git of a state or a
comparison, :class:`~prohost.engine.repos.gitsession.ConfinedGit`) or ``per-git``
(a bubblewrap process for each git, the cost that batching saves). The column
``procs`` is how many confined processes a comparison started.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from statistics import median
from typing import Any

import trio

from prohost.engine.repos.changes import CheckoutReader
from prohost.engine.repos.gitcmd import GIT_TIMEOUT_S, git_env
from prohost.engine.repos.gitsession import PLAIN_GIT, ConfinedGit, Git
from prohost.engine.sandbox import Policy, confined_command, seccomp
from prohost.wire.protocol import converter

USER = ["-c", "user.name=bench", "-c", "user.email=bench@example.invalid"]


def git(path: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(path), *args], check=True, env=git_env(),
                          capture_output=True).stdout.decode("utf-8", "replace")


def tracked(index: int) -> str:
    return f"pkg{index // 500}/mod{index // 50}/file{index}.py"


def make_repo(path: Path, files: int) -> None:
    """``files`` files of a few hundred bytes, 50 to a folder, committed once."""
    for index in range(files):
        name = path / tracked(index)
        name.parent.mkdir(parents=True, exist_ok=True)
        name.write_text(f"# file {index}\n" + "x = 1\n" * 40)
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    # No auto gc: it would pack in the background, during the cases, and the store's
    # count would change for a reason of its own. Packed here, once, instead.
    git(path, *USER, "-c", "gc.auto=0", "commit", "-q", "-m", "generated")
    git(path, "config", "gc.auto", "0")
    git(path, "gc", "-q")


def cases(files: int, scale: float) -> dict[str, Any]:
    many = max(1, int(10_000 * scale))

    def edit(path: Path, count: int) -> None:
        for index in range(0, files, max(1, files // count))[:count]:
            with open(path / tracked(index), "a") as file:
                file.write("y = 2\n")

    def untracked(path: Path) -> None:
        for index in range(many):
            name = path / "new" / f"d{index // 100}" / f"n{index}.txt"
            name.parent.mkdir(parents=True, exist_ok=True)
            name.write_text(f"new {index}\n")

    def big(path: Path) -> None:
        line = b"a line of a big generated text file, sixty-four bytes or so..\n"
        with open(path / "big.txt", "wb") as file:
            for _ in range(max(1, int(50 * 2**20 * scale)) // len(line)):
                file.write(line)

    return {
        "10 changed": lambda path: edit(path, 10),
        f"{many:,} modified": lambda path: edit(path, many),
        f"{many:,} untracked": untracked,
        f"one {max(1, int(50 * scale))} MB file": big,
    }


def plain(path: Path) -> float:
    start = time.perf_counter()
    git(path, "--no-optional-locks", "status", "--porcelain=v2", "-z",
        "--untracked-files=all")
    git(path, "--no-optional-locks", "diff", "--numstat", "-z", "HEAD")
    return time.perf_counter() - start


def _confine(argv: list[str], readable: Sequence[Path],
             writable: Sequence[Path]) -> tuple[list[str], int | None]:
    # As the harness's (prohost.engine.run.checkouts.git_confinement): with the filter.
    fd = seccomp.filter_fd()
    policy = Policy(readable=tuple(readable), writable=tuple(writable))
    return confined_command(policy, argv, seccomp_fd=fd), fd


class _PerGit:
    """A confined process for each git (what :class:`ConfinedGit` saves)."""

    confined = True

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.scratch = folder  # readable in each confinement: the line counts' copies
        self.started = 0

    async def __call__(self, *args: str, timeout_s: float = GIT_TIMEOUT_S,
                       env: Mapping[str, str] | None = None,
                       ok_codes: tuple[int, ...] = (0,)) -> str:
        async with ConfinedGit(_confine, [self.folder], self.folder / "scratch") as run:
            self.started += 1
            return await run(*args, timeout_s=timeout_s, env=env, ok_codes=ok_codes)


@contextlib.asynccontextmanager
async def reader(how: str, folder: Path) -> AsyncIterator[Git]:
    """Where a state's or a comparison's git runs (see ``--git``)."""
    if how == "plain":
        yield PLAIN_GIT
    elif how == "per-git":
        yield _PerGit(folder)
    else:
        async with ConfinedGit(_confine, [folder], folder / "scratch") as run:
            yield run


async def one_case(path: Path, change: Any, repeat: int, how: str = "plain",
                   ) -> dict[str, Any]:
    """One case: ``repeat`` pairs of (ours, the floor) before the change and after
    it, each pair back to back so that both meet the same machine; the medians."""
    git(path, "checkout", "-q", "--", ".")
    git(path, "clean", "-qfdx")
    store = git(path, "count-objects", "-v")
    states: list[tuple[float, float]] = []
    for _ in range(repeat):
        start = time.perf_counter()
        async with reader(how, path.parent) as run:
            before = await CheckoutReader(run=run).state("bench", path)
        states.append((time.perf_counter() - start, plain(path)))
    change(path)
    compares: list[tuple[float, float]] = []
    for _ in range(repeat):
        start = time.perf_counter()
        async with reader(how, path.parent) as run:
            entry = converter.unstructure(await CheckoutReader(run=run).compare(before))
        compares.append((time.perf_counter() - start, plain(path)))
        processes = getattr(run, "started", 0)
    return {
        "state_s": median(ours for ours, _ in states),
        "plain_before_s": median(floor for _, floor in states),
        "compare_s": median(ours for ours, _ in compares),
        "plain_after_s": median(floor for _, floor in compares),
        "state_ratio": median(ours / floor for ours, floor in states),
        "compare_ratio": median(ours / floor for ours, floor in compares),
        "files": len(entry.get("files", [])) + entry.get("more_files", 0),
        "truncated": entry.get("truncated"), "error": entry.get("error"),
        "objects_unchanged": git(path, "count-objects", "-v") == store,
        "processes": processes,
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="prohost-bench-changes-"))
    try:
        repo = folder / "repo"
        repo.mkdir()
        make_repo(repo, args.files)
        return {name: await one_case(repo, change, args.repeat, getattr(args, "git", "plain"))
                for name, change in cases(args.files, args.scale).items()}
    finally:
        if args.keep:
            print(f"kept {folder}", file=sys.stderr)
        else:
            shutil.rmtree(folder, ignore_errors=True)


def print_report(figures: dict[str, Any]) -> None:
    print(f"{'case':<20} {'state s':>8} {'ratio':>6} {'compare s':>10} {'ratio':>6} "
          f"{'files':>7} {'procs':>5}  objects   note")
    for name, row in figures.items():
        note = row["error"] or row["truncated"] or ""
        print(f"{name:<20} {row['state_s']:>8.3f} {row['state_ratio']:>6.1f} "
              f"{row['compare_s']:>10.3f} {row['compare_ratio']:>6.1f} {row['files']:>7,} "
              f"{row['processes']:>5}  "
              f"{'same' if row['objects_unchanged'] else 'CHANGED':<9} {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=50_000)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--repeat", type=int, default=5,
                        help="pairs (ours, the floor) per measure; the medians are shown")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--git", choices=("plain", "confined", "per-git"), default="plain",
                        help="where the git runs (see the module)")
    args = parser.parse_args()
    figures = trio.run(main_async, args)
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print_report(figures)


if __name__ == "__main__":
    main()
