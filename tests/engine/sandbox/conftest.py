"""Fixtures of the sandbox room's tests: a made-up home, and a confined child."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import attrs
import pytest

from prohost.engine.sandbox import (
    SIMULATE_ABSENT_ENV,
    Confinement,
    Policy,
    RuleCache,
    Support,
    defaults,
    prepare,
    probe,
)
from prohost.engine.sandbox.confinement import prepare_anew

SUPPORT = probe()
needs_landlock = pytest.mark.skipif(
    SUPPORT.kind != "landlock", reason=f"no Landlock here: {SUPPORT.reason or SUPPORT.detail}")


@attrs.frozen
class Home:
    """A home folder laid out like a person's, under the test's tmp_path."""

    root: Path
    #: A run's writable place (a worktree, say).
    work: Path
    #: Read-only to runs: an original checkout.
    original: Path
    #: The harness's own folder, hidden, with a run's writable worktree inside.
    prohost: Path
    worktree: Path

    def policy(self, *, writable: Sequence[Path] = (), readable: Sequence[Path] = (),
               hidden: Sequence[Path] = (),
               mounts: Sequence[tuple[Path, Path]] = ()) -> Policy:
        """The harness's usual policy for this home, plus what a test adds."""
        return Policy(
            writable=(self.work, self.worktree, *defaults.devices(), *writable),
            readable=tuple(readable),
            hidden=(*defaults.secrets(self.root), self.prohost, *hidden),
            mounts=tuple(mounts))


@pytest.fixture
def home(tmp_path: Path) -> Home:
    root = tmp_path / "home"
    for folder in (".ssh", ".aws", ".config/gh", "src", "work", "original",
                   ".local/share/prohost/worktrees/lane-a", ".cache"):
        (root / folder).mkdir(parents=True)
    (root / ".ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
    (root / ".ssh" / "known_hosts").write_text("example.com ssh-ed25519 AAAA\n")
    (root / ".aws" / "credentials").write_text("[default]\n")
    (root / ".config" / "gh" / "hosts.yml").write_text("token: x\n")
    (root / ".local" / "share" / "prohost" / "credentials.json").write_text("{}\n")
    (root / "notes.txt").write_text("a note\n")
    (root / "src" / "readme").write_text("readable\n")
    (root / "original" / "file").write_text("original\n")
    prohost = root / ".local" / "share" / "prohost"
    return Home(root=root, work=root / "work", original=root / "original", prohost=prohost,
                worktree=prohost / "worktrees" / "lane-a")


#: A child that tries one file operation and prints the errno's name (or ``ok``).
PROBE = """
import errno, os, sys
op, path = sys.argv[1], sys.argv[2]
try:
    if op == "read":
        open(path).read()
    elif op == "write":
        open(path, "a").write("x")
    elif op == "list":
        os.listdir(path)
    print("ok")
except OSError as error:
    print(errno.errorcode[error.errno])
"""

#: The ways a run's Landlock rules are made, each a :class:`Confiner`'s ``way``.
WAYS = ("anew", "cached", "warm")


@attrs.define
class Confiner:
    """Makes a test's confinements one way of the harness's two preparations, so
    that a test of what a confined child may do checks each of them:

    - ``anew``: :func:`~prohost.engine.sandbox.confinement.prepare_anew`, nothing kept;
    - ``cached``: :func:`prepare` with a fresh :class:`RuleCache` as the harness
      gives it (``Support.rules``): ``RuleCache._prepare`` listing and opening all;
    - ``warm``: the second confinement for the same policy from one cache, made
      from what the first kept (the walk's folders, nothing changed since, are not
      listed again, and the kept descriptors are reused): what the harness's later
      runs get.

    Each confinement has a cache of its own: a change a test makes between two of
    them is then seen whatever the clock's grain (the cache's staleness is
    ``test_cache.py``'s and ``test_made_ahead.py``'s).
    """

    way: str
    caches: list[RuleCache] = attrs.field(factory=list)

    def __call__(self, policy: Policy) -> Confinement:
        """A confinement for ``policy``, made this way; close it after use."""
        if self.way == "anew":
            return prepare_anew(policy, SUPPORT)
        # warm: trusts folders however recently changed, so its second preparation
        # reuses the walk of tmp_path's fresh folders too (nothing changes between).
        cache = RuleCache() if self.way == "cached" else RuleCache(recent_ns=0)
        self.caches.append(cache)
        if self.way == "warm":
            prepare(policy, cached(cache)).close()
            assert cache.held, "the first preparation kept nothing"
        confinement = prepare(policy, cached(cache))
        # Made by the cache's own path, not by its uncached fallback (which holds none).
        assert cache.held, "the cache made no rules of its own"
        return confinement

    def attempt(self, policy: Policy, op: str, path: Path) -> str:
        """What a confined child got from ``op`` on ``path``: ``ok`` or an errno name."""
        with self(policy) as confinement:
            assert confinement.confined
            return tried(confinement, op, path)

    def run(self, policy: Policy, script: str, **options: object
            ) -> subprocess.CompletedProcess[str]:
        """``sh -c script`` started confined by ``policy``, its output captured."""
        with self(policy) as confinement:
            assert confinement.confined
            return subprocess.run(["sh", "-c", script], preexec_fn=confinement.preexec,
                                  capture_output=True, text=True, check=False, timeout=60,
                                  **options)  # type: ignore[call-overload]


@pytest.fixture(params=WAYS)
def confine(request: pytest.FixtureRequest) -> Iterator[Confiner]:
    """A :class:`Confiner` for each way a run's rules are made."""
    confiner = Confiner(request.param)
    yield confiner
    for cache in confiner.caches:
        cache.close()


@pytest.fixture(autouse=True)
def _no_simulated_absence(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # A developer's shell may have the test hook set; these tests need the real probe.
    monkeypatch.delenv(SIMULATE_ABSENT_ENV, raising=False)
    yield


# The rule cache's tests' kit (test_cache.py, test_made_ahead.py).

DENIED_READ = {"EACCES", "ENOENT"}


@pytest.fixture
def cache() -> Iterator[RuleCache]:
    # Trusts a folder however recently it changed: the tests make them just now,
    # and each change they check also moves a folder's mtime off the old one set
    # by ``aged`` (see there), so no clock tick can hide it.
    kept = RuleCache(recent_ns=0)
    yield kept
    kept.close()


def cached(cache: RuleCache) -> Support:
    return attrs.evolve(SUPPORT, rules=cache)


def aged(*folders: Path) -> None:
    """Give ``folders`` an mtime long past: an entry added or removed later sets it
    to now, which differs whatever the clock's grain."""
    for folder in folders:
        os.utime(folder, ns=(1_000_000_000, 1_000_000_000))


def tried(confinement: Confinement, op: str, path: Path) -> str:
    """What a child confined by ``confinement`` got from ``op`` on ``path``."""
    done = subprocess.run([sys.executable, "-I", "-S", "-c", PROBE, op, str(path)],
                          preexec_fn=confinement.preexec, capture_output=True, text=True,
                          check=True, timeout=60)
    return done.stdout.strip()
