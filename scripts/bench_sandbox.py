"""What confining a run costs: ``prepare()`` for a realistic policy, and a spawn.

Usage: ``.venv/bin/python scripts/bench_sandbox.py [--spawns N]``

A made-up home (~50 entries, the default secrets present, a ``$PROHOST_HOME`` with
a worktree inside) is built in a temporary folder; then, in the same run:

- ``prepare()``: resolving the policy, walking the folders on the way to each hidden
  place and adding every Landlock rule (what a run pays in a worker thread);
- a spawn of ``/bin/true`` waited to its exit, four ways, interleaved round by round
  so drift hits each the same: the unconfined floor (subprocess's vfork path), a
  no-op ``preexec_fn`` (what a preexec alone costs: subprocess forks instead of
  vforking), the confinement's preexec, and
  ``Confinement.spawn_from_a_confined_thread`` (a throwaway thread that confines
  itself and spawns without a preexec: no code in the child).

Each figure is the median; ratios are to the unconfined floor. Prints lines of text.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prohost.engine.sandbox import Policy, defaults, prepare, probe
from prohost.engine.sandbox.confinement import Confinement


def make_home(root: Path) -> tuple[Path, Policy]:
    """A home with ~50 entries and the harness's usual policy for one run."""
    home = root / "home"
    home.mkdir()
    for name in defaults.SECRETS[:8]:
        (home / name).mkdir(parents=True, exist_ok=True)
    for index in range(34):
        (home / f"project-{index}").mkdir()
    for index in range(8):
        (home / f"file-{index}.txt").write_text("x")
    prohost = home / ".local" / "share" / "prohost"
    worktree = prohost / "worktrees" / "lane-a"
    worktree.mkdir(parents=True)
    for name in defaults.CACHES[:4]:
        (home / name).mkdir(parents=True, exist_ok=True)
    policy = Policy(writable=(worktree, *defaults.caches(home), *defaults.devices()),
                    hidden=(*defaults.secrets(home), prohost))
    return home, policy


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def spawn(preexec: Callable[[], None] | None) -> None:
    # As the harness spawns an agent: its own session, pipes for its output.
    subprocess.Popen(["/bin/true"], preexec_fn=preexec, start_new_session=True,
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE).communicate()


def spawn_from_confined_thread(confinement: Confinement) -> None:
    """The no-code-in-the-child way: a fresh thread enters the domain (it is per
    thread), spawns on subprocess's vfork path, and ends."""
    confinement.spawn_from_a_confined_thread(lambda: spawn(None))


def spawn_from_fresh_thread() -> None:
    """What a fresh thread alone costs (the confined thread's own floor)."""
    thread = threading.Thread(target=lambda: spawn(None))
    thread.start()
    thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spawns", type=int, default=200)
    parser.add_argument("--ballast-mb", type=int, default=0,
                        help="memory to hold while spawning, as a harness's size (a fork "
                             "copies the page tables, a vfork does not)")
    args = parser.parse_args()
    ballast = bytearray(args.ballast_mb << 20)
    ballast[::4096] = b"x" * len(ballast[::4096])  # touched, so the pages exist
    support = probe()
    print(f"support: {support.kind} {support.detail or support.reason}")
    if support.kind != "landlock":
        return
    with tempfile.TemporaryDirectory() as folder:
        home, policy = make_home(Path(folder))
        print(f"home entries: {len(os.listdir(home))}; ballast {len(ballast) >> 20} MiB")
        prepares = []
        for _ in range(30):
            start = time.perf_counter()
            prepare(policy, support).close()
            prepares.append(time.perf_counter() - start)
        print(f"prepare(): median {statistics.median(prepares) * 1e3:.2f} ms, "
              f"max {max(prepares) * 1e3:.2f} ms")
        with prepare(policy, support) as confinement:
            assert confinement.preexec is not None
            confined = confinement.preexec
            ways: dict[str, Callable[[], None]] = {
                "unconfined (floor)": lambda: spawn(None),
                "no-op preexec_fn": lambda: spawn(lambda: None),
                "confined preexec": lambda: spawn(confined),
                "confined thread, no preexec": lambda: spawn_from_confined_thread(confinement),
                "unconfined fresh thread": lambda: spawn_from_fresh_thread(),
            }
            times: dict[str, list[float]] = {name: [] for name in ways}
            for _ in range(args.spawns):
                for name, action in ways.items():
                    times[name].append(timed(action))
        floor = statistics.median(times["unconfined (floor)"])
        for name, values in times.items():
            median = statistics.median(values)
            print(f"spawn+wait {name:28s} median {median * 1e3:6.2f} ms  "
                  f"ratio {median / floor:5.2f}")


if __name__ == "__main__":
    main()
