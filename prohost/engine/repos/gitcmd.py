"""Running one git command for the worktrees (§5.1) and their collection.

:func:`git` runs ``git`` bounded in time, in a process group of its own that is
killed whole on a timeout or a cancel, never prompting, and in an environment
(:func:`git_env`) that cannot point it at a repository other than the one named
on its command line. Failures become one :class:`GitError` line.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path

import trio

from prohost.errors import LAST_LINE_CHARS, last_line

#: A `git worktree add` checks out the whole tree (and runs the repo's post-checkout
#: hook, LFS smudging included), so it gets five minutes; everything else is quick.
#: Both in seconds.
GIT_ADD_TIMEOUT_S = 300.0
GIT_TIMEOUT_S = 60.0

#: Variables that point git at a particular repository, index or config (what
#: `git rev-parse --local-env-vars` lists). A harness started from a git hook or
#: an editor's terminal can carry them; they would make every git command act on
#: that repository instead of the one named with -C.
GIT_LOCATION_VARS = frozenset({
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_CONFIG",
    "GIT_CONFIG_COUNT",
    "GIT_CONFIG_PARAMETERS",
    "GIT_DIR",
    "GIT_GRAFT_FILE",
    "GIT_IMPLICIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_INTERNAL_SUPER_PREFIX",
    "GIT_NO_REPLACE_OBJECTS",
    "GIT_OBJECT_DIRECTORY",
    "GIT_PREFIX",
    "GIT_REPLACE_REF_BASE",
    "GIT_SHALLOW_FILE",
    "GIT_WORK_TREE",
})


class GitError(Exception):
    """A git command failed; the message is one short line (git's last stderr line)."""


class GitTimedOut(GitError):
    """A git command outlived its bound and was stopped: trying it again would only
    take as long again."""


def git_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment git runs with: ``base`` without repository-locating variables,
    never prompting (a daemon has no terminal to answer on), in the C locale (so the
    ``initializing`` lock git writes, and its messages, read the same everywhere)."""
    env = {
        name: value
        for name, value in (os.environ if base is None else base).items()
        if name not in GIT_LOCATION_VARS
    }
    env["GIT_TERMINAL_PROMPT"] = "0"
    env["LC_ALL"] = "C"
    return env


async def _kill_group(process: trio.Process) -> None:
    # The whole group, at once: `git worktree add` checks out in a child git and
    # runs hooks, and a SIGTERM to git alone lets it exit (trio then stops waiting)
    # while the child goes on writing into a folder git's own cleanup just removed.
    # What SIGKILL leaves behind, the lane's next prepare clears (the "junk" state
    # of prohost.engine.repos.worktrees).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


async def git(
    *args: str, timeout_s: float = GIT_TIMEOUT_S, env: Mapping[str, str] | None = None,
    ok_codes: tuple[int, ...] = (0,),
) -> str:
    """Run ``git *args``; return its stdout (decoded as file names are), or raise
    :class:`GitError` (for an exit status not in ``ok_codes``). On cancellation or
    timeout git and every process it started are killed (it runs in a process group
    of its own) before this returns.

    Cancelled: the group is killed with SIGKILL (trio's ``deliver_cancel``), the
    process is reaped, and the cancellation propagates."""
    what = next((arg for arg in args if not arg.startswith("-") and "/" not in arg), "git")
    with trio.move_on_after(timeout_s) as scope:
        try:
            done = await trio.run_process(
                ["git", *args],
                stdin=subprocess.DEVNULL,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                env=env if env is not None else git_env(),
                # A group of its own (pgid == pid), so _kill_group reaches its children.
                start_new_session=True,
                deliver_cancel=_kill_group,
            )
        except FileNotFoundError:
            raise GitError("git is not installed (no git on PATH)") from None
        except OSError as exc:
            raise GitError(f"could not run git: {exc.strerror or exc}") from None
    if scope.cancelled_caught:
        raise GitTimedOut(f"git {what} took longer than {timeout_s:g} s and was stopped")
    if done.returncode not in ok_codes:
        reason = _reason(done.stderr) or f"git {what} exited with status {done.returncode}"
        raise GitError(reason)
    return os.fsdecode(done.stdout)


def _reason(stderr: bytes) -> str:
    """git's own reason, in one line: its last line, after the ``error:`` line that
    said why when the last is only the ``fatal:`` conclusion (``adding files failed``)."""
    last = last_line(stderr)
    errors = [line.strip() for line in stderr.decode("utf-8", "replace").splitlines()
              if line.startswith("error: ")]
    if errors and last and last.startswith("fatal: ") and errors[-1] != last:
        return f"{errors[-1][:LAST_LINE_CHARS]} ({last})"
    return last


def real_path(path: Path | str) -> str:
    """``path`` with every symlink resolved: how git's own paths are compared."""
    return os.path.realpath(path)
