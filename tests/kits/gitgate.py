"""A checkout that waits for the test: a git smudge filter (or hook) that holds the
first checkout of a repository until the test lets it go, on fifos the test holds.

No sleeps: the test learns the checkout has begun by reading ``started`` (the
filter's write to that fifo returns only then), and lets it go by writing a line to
``release``, which the filter holds open read-write from before it announces itself,
so a release never blocks and never gets lost. Only the first checkout waits (an
atomic ``mkdir`` of ``taken``); later ones pass straight through.
"""

from __future__ import annotations

import errno
import os
import shlex
import subprocess
from pathlib import Path

import trio

_GATE = """\
if mkdir {taken} 2>/dev/null; then
  exec 3<>{release}
  echo waiting > {started}
  read line <&3
  exec 3<&-
fi
"""


class Gate:
    """The fifos one gated repository's first checkout waits on."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.started = folder / "started"
        self.release_fifo = folder / "release"
        os.mkfifo(self.started)
        os.mkfifo(self.release_fifo)

    def script(self, tail: str) -> str:
        return "#!/bin/sh\n" + _GATE.format(
            taken=shlex.quote(str(self.folder / "taken")),
            release=shlex.quote(str(self.release_fifo)),
            started=shlex.quote(str(self.started)),
        ) + tail

    def disarm(self) -> None:
        """Let every checkout through from now on (the first has already waited)."""
        (self.folder / "taken").mkdir(exist_ok=True)

    async def wait_started(self) -> None:
        """Return once the first checkout is inside the filter, waiting for :meth:`release`."""

        def read() -> str:
            with open(self.started, encoding="utf-8") as fifo:
                return fifo.read()

        # A blocked open() cannot be cancelled; abandoned, so a failing test ends.
        assert await trio.to_thread.run_sync(read, abandon_on_cancel=True) == "waiting\n"

    def release(self) -> bool:
        """Let the waiting checkout go on; ``False`` if none waits (it was killed)."""
        try:
            fd = os.open(self.release_fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no reader: the filter is gone
                return False
            raise
        try:
            os.write(fd, b"go\n")
        except BrokenPipeError:
            return False  # the filter was killed between the open and the write
        finally:
            os.close(fd)
        return True


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def gate_checkouts(repo: Path, gate_folder: Path, slow_file: str = "slow.txt") -> Gate:
    """Make checkouts of ``repo`` (a repository with a commit) wait at ``slow_file``
    on a :class:`Gate`: a smudge filter on that one file, so the first checkout
    stops half-way, git's "initializing" lock still in place."""
    gate = Gate(gate_folder)
    script = gate_folder / "smudge.sh"
    script.write_text(gate.script("exec cat\n"))
    script.chmod(0o755)
    (repo / ".gitattributes").write_text(f"{slow_file} filter=gate\n")
    (repo / slow_file).write_text("slow\n")
    _git(repo, "add", ".gitattributes", slow_file)
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid",
         "commit", "-q", "-m", "a slow file")
    # Set after the commit, so only checkouts run it.
    _git(repo, "config", "filter.gate.smudge", str(script))
    return gate


def gate_post_checkout(repo: Path, gate_folder: Path) -> Gate:
    """Make the first checkout of ``repo`` wait in its post-checkout hook: the tree is
    complete and git's lock gone, but `git worktree add` has not returned."""
    gate = Gate(gate_folder)
    hook = repo / ".git" / "hooks" / "post-checkout"
    hook.write_text(gate.script("exit 0\n"))
    hook.chmod(0o755)
    return gate
