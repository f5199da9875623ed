"""Landlock and bubblewrap as the sandbox tests drive them: a home with secrets, a
confiner, and a child that tries one operation and says what it got."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import attrs
import pytest

from prohost.engine.sandbox import (
    Confinement,
    Policy,
    defaults,
    probe,
)
from prohost.engine.sandbox.confinement import prepare_landlock

SUPPORT = probe()
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

needs_landlock = pytest.mark.skipif(
    not SUPPORT.abi, reason=f"no Landlock here: {SUPPORT.reason or SUPPORT.detail}")


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


@attrs.define
class Confiner:
    """Makes a test's confinements as the Landlock fallback does (Landlock's
    filesystem rules alone: where bubblewrap cannot run)."""

    def __call__(self, policy: Policy) -> Confinement:
        """A confinement for ``policy``; close it after use."""
        return prepare_landlock(policy, SUPPORT)

    def attempt(self, policy: Policy, op: str, path: Path) -> str:
        """What a confined child got from ``op`` on ``path``: ``ok`` or an errno name."""
        with self(policy) as confinement:
            return tried(confinement, op, path)

    def run(self, policy: Policy, script: str, **options: object
            ) -> subprocess.CompletedProcess[str]:
        """``sh -c script`` started confined by ``policy``, its output captured."""
        with self(policy) as confinement:
            return subprocess.run(["sh", "-c", script], preexec_fn=confinement.preexec,
                                  capture_output=True, text=True, check=False, timeout=60,
                                  **options)  # type: ignore[call-overload]


DENIED_READ = {"EACCES", "ENOENT"}




def tried(confinement: Confinement, op: str, path: Path) -> str:
    """What a child confined by ``confinement`` got from ``op`` on ``path``."""
    done = subprocess.run([sys.executable, "-I", "-S", "-c", PROBE, op, str(path)],
                          preexec_fn=confinement.preexec, capture_output=True, text=True,
                          check=True, timeout=60)
    return done.stdout.strip()


