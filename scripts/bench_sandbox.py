"""What confining a run costs: ``prepare()`` for a realistic policy, and a spawn.

Usage: ``.venv/bin/python scripts/bench_sandbox.py [--spawns N]``

A made-up home (~50 entries, the default secrets present, a ``$PROHOST_HOME`` with
a worktree inside) is built in a temporary folder; then, in the same run:

- ``prepare()``: resolving the policy, walking the folders on the way to each hidden
  place and adding every Landlock rule (what a run pays in a worker thread), made
  anew, then with the harness's :class:`RuleCache` (issue 29: what runs share is
  kept); and the uncached one's parts (resolve, walk, open and add each rule);
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

import attrs

from prohost.engine.sandbox import Policy, RuleCache, Support, defaults, landlock, prepare, probe
from prohost.engine.sandbox.confinement import Confinement, complement, prepare_anew


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


def report_prepare(policy: Policy, support: Support) -> None:
    """prepare()'s median, anew and cached, and the parts of one made anew."""
    cache = RuleCache()
    kept = attrs.evolve(support, rules=cache)
    parts: dict[str, list[float]] = {name: [] for name in (
        "anew", "cached", "  resolve", "  walk", "  open + add rules")}
    count = 0
    for _ in range(100):
        parts["anew"].append(timed(lambda: prepare_anew(policy, support).close()))
        parts["cached"].append(timed(lambda: prepare(policy, kept).close()))
        start = time.perf_counter()
        real = policy.resolved()
        resolved = time.perf_counter()
        rest = complement([str(place) for place in real.hidden])
        walked = time.perf_counter()
        ruleset = landlock.Ruleset(landlock.abi_version())
        paths = [(path, landlock.READ) for path in rest]
        paths += [(str(path), landlock.READ) for path in real.readable]
        paths += [(str(path), ruleset.handled) for path in real.writable]
        for path, rights in paths:
            ruleset.allow(path, rights)
        ruleset.close()
        parts["  resolve"].append(resolved - start)
        parts["  walk"].append(walked - resolved)
        parts["  open + add rules"].append(time.perf_counter() - walked)
        count = len(paths)
    cache.close()
    print(f"prepare(), {count} rules ({cache.walks_reused} of 100 cached ones listed no "
          "folder again: a folder changed in the last 2 s is listed again):")
    for name, values in parts.items():
        print(f"  {name:20s} median {statistics.median(values) * 1e3:6.3f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spawns", type=int, default=200)
    parser.add_argument("--ballast-mb", type=int, default=0,
                        help="memory to hold while spawning, as a harness's size (a fork "
                             "copies the page tables, a vfork does not)")
    parser.add_argument("--folder", default=None,
                        help="where to make the home (default: the temporary folder; "
                        "a busy one, as a shared /tmp, is listed again by the cache)")
    args = parser.parse_args()
    ballast = bytearray(args.ballast_mb << 20)
    ballast[::4096] = b"x" * len(ballast[::4096])  # touched, so the pages exist
    support = probe()
    print(f"support: {support.kind} {support.detail or support.reason}")
    if support.kind != "landlock":
        return
    with tempfile.TemporaryDirectory(dir=args.folder) as folder:
        home, policy = make_home(Path(folder))
        time.sleep(2.5)  # past the cache's "changed just now" window (RECENT_NS)
        print(f"home entries: {len(os.listdir(home))}; ballast {len(ballast) >> 20} MiB")
        report_prepare(policy, support)
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
