"""Running one git command for the worktrees (§5.1) and their collection.

:func:`git` runs ``git`` bounded in time, in a process group of its own that is
killed whole on a timeout or a cancel, never prompting, and in an environment
(:func:`git_env`) that cannot point it at a repository other than the one named
on its command line. Failures become one :class:`GitError` line.

The harness's git works on places a hostile run could write (§13): a worktree's
files, its ``.git`` file, its private git dir (``HEAD``, index, logs). So every
git here runs with :data:`HARDENED` settings on its command line, which win over
every config file: no fsmonitor program, no hooks, no pager, editor or network.
On a worktree, :func:`git_at` names the git dir, common dir and work tree from
the harness's own records (:class:`GitPlaces`), so git never discovers them from
a ``.git`` file or ``commondir`` a run could have rewritten. What git still reads
of its own accord is the common dir's ``config`` (the harness's, including the
person's, which no run may write) and the git dir's ``config.worktree`` when the
repository turns ``extensions.worktreeConfig`` on (only one of the person's: see
:mod:`prohost.engine.repos.gitrecords`). Where runs are confined by bubblewrap,
the git that reads a run's places runs inside a confinement too
(:mod:`prohost.engine.repos.gitsession`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs
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


#: Settings given on every harness git's command line: they win over the
#: repository's, the person's and any file a run planted. Why each:
#: ``core.fsmonitor`` and ``core.hooksPath`` name programs git would run;
#: ``core.untrackedCache`` is written into an index a run can read; the
#: protocols keep a harness's git off the network (it never needs it); the
#: pager and editor are programs too; ``core.sshCommand`` and
#: ``credential.helper`` never matter offline, and are cleared all the same.
#: (``diff.external`` cannot be cleared here, an empty one is "run nothing" and
#: fails: a harness's diff passes ``--no-ext-diff --no-textconv`` instead.)
HARDENED: tuple[str, ...] = (
    "-c", "core.fsmonitor=false",
    "-c", "core.hooksPath=/dev/null",
    "-c", "core.untrackedCache=false",
    "-c", "core.pager=cat",
    "-c", "core.editor=false",
    "-c", "sequence.editor=false",
    "-c", "core.sshCommand=false",
    "-c", "credential.helper=",
    "-c", "protocol.allow=never",
    "-c", "submodule.recurse=false",
)

#: Variables that would make git run a program or read a config file of their
#: choosing; dropped from every harness git's environment.
_PROGRAM_VARS = frozenset({
    "GIT_EXTERNAL_DIFF", "GIT_PAGER", "GIT_EDITOR", "GIT_SEQUENCE_EDITOR", "GIT_SSH",
    "GIT_SSH_COMMAND", "GIT_ASKPASS", "SSH_ASKPASS", "GIT_PROXY_COMMAND", "GIT_EXEC_PATH",
    "GIT_TEMPLATE_DIR", "GIT_CONFIG_SYSTEM", "PAGER", "EDITOR", "VISUAL",
})


@attrs.frozen
class GitPlaces:
    """Where a worktree's git state is, as the harness made it (its records), never
    as its ``.git`` file says: the work tree, its private git dir
    (``<common>/worktrees/<name>``) and the repository's common dir. Real paths."""

    work_tree: str
    git_dir: str
    common_dir: str

    def args(self) -> tuple[str, ...]:
        """The options that name these places on git's command line."""
        return ("--git-dir", self.git_dir, "--work-tree", self.work_tree)

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """:func:`git_env` naming these places: ``GIT_COMMON_DIR`` so that git
        reads no ``commondir`` file; git dir and work tree so that a ``git -C``
        anywhere inside (a submodule's folder) is still this repository."""
        env = git_env(base)
        env["GIT_DIR"] = self.git_dir
        env["GIT_WORK_TREE"] = self.work_tree
        env["GIT_COMMON_DIR"] = self.common_dir
        return env


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
        if name not in GIT_LOCATION_VARS and name not in _PROGRAM_VARS
    }
    env["GIT_TERMINAL_PROMPT"] = "0"
    # The system's config is the machine's, not the person's; a harness's git
    # needs nothing of it (and it could name programs).
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    env["GIT_PAGER"] = "cat"
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
    ok_codes: tuple[int, ...] = (0,), stdin: bytes | None = None,
) -> str:
    """Run ``git *args``; return its stdout (decoded as file names are), or raise
    :class:`GitError` (for an exit status not in ``ok_codes``). ``stdin``: what git
    reads on its standard input (nothing when ``None``). On cancellation or
    timeout git and every process it started are killed (it runs in a process group
    of its own) before this returns.

    Cancelled: the group is killed with SIGKILL (trio's ``deliver_cancel``), the
    process is reaped, and the cancellation propagates."""
    return await run_git(["git", *HARDENED, *args], timeout_s=timeout_s, env=env,
                         ok_codes=ok_codes, stdin=stdin)


async def run_git(
    argv: Sequence[str], *, timeout_s: float = GIT_TIMEOUT_S,
    env: Mapping[str, str] | None = None, ok_codes: tuple[int, ...] = (0,),
    stdin: bytes | None = None, pass_fds: tuple[int, ...] = (),
) -> str:
    """Run ``argv`` as :func:`git` runs git: a command line that runs git in
    the end (a confined one, ``bwrap … -- git …``), with :data:`HARDENED` in it
    already; ``pass_fds``: descriptors it is passed (bubblewrap's filter).
    Cancelled: as :func:`git`."""
    what = what_of(argv[1:])
    with trio.move_on_after(timeout_s) as scope:
        try:
            done = await trio.run_process(
                list(argv),
                stdin=subprocess.DEVNULL if stdin is None else stdin,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                env=env if env is not None else git_env(),
                # A group of its own (pgid == pid), so _kill_group reaches its children.
                start_new_session=True,
                deliver_cancel=_kill_group,
                pass_fds=pass_fds,
            )
        except FileNotFoundError:
            raise GitError("git is not installed (no git on PATH)") from None
        except OSError as exc:
            raise GitError(f"could not run git: {exc.strerror or exc}") from None
    if scope.cancelled_caught:
        raise GitTimedOut(f"git {what} took longer than {timeout_s:g} s and was stopped")
    return answer(what, done.returncode, done.stdout, done.stderr, ok_codes)


def what_of(args: Sequence[str]) -> str:
    """The git command ``args`` runs (``status``), as an error names it."""
    return next((arg for arg in args if not arg.startswith("-") and "/" not in arg
                 and "=" not in arg and arg != "git"), "git")


def answer(what: str, returncode: int, stdout: bytes, stderr: bytes,
           ok_codes: tuple[int, ...] = (0,)) -> str:
    """A finished git's stdout (decoded as file names are), or :class:`GitError`
    with git's own reason when ``returncode`` is not in ``ok_codes``."""
    if returncode not in ok_codes:
        raise GitError(_reason(stderr) or f"git {what} exited with status {returncode}")
    return os.fsdecode(stdout)


async def git_at(
    places: GitPlaces, *args: str, timeout_s: float = GIT_TIMEOUT_S,
    env: Mapping[str, str] | None = None, ok_codes: tuple[int, ...] = (0,),
) -> str:
    """:func:`git` on the worktree at ``places``, every one of its paths named
    (never discovered from its ``.git`` file). ``env``: a base environment.

    Cancelled: as :func:`git`."""
    return await git(*places.args(), *args, timeout_s=timeout_s,
                     env=places.env(env), ok_codes=ok_codes)


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
