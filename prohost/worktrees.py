"""Private git worktrees for each conversation (§5.1), and clearing away old ones.

Why: with ``--concurrency`` above 1, two conversations' agents would otherwise do
their git work in the same checkout. One switches branch under the other, one
commits the other's half-edited files, and ``git stash`` pops into the wrong run.
So every lane gets, for each ``--repos`` checkout, a worktree of its own::

    $PROHOST_HOME/worktrees/<lane folder>/<repo name>      (a `git worktree add --detach`)
    $PROHOST_HOME/worktrees/<lane folder>/.prohost-lane    (lane id and last use, for GC)

A worktree persists across the lane's turns: a branch or an uncommitted change in
it is the conversation's own earlier work, so later turns reuse it as it is. The
lane folder goes into ``PROHOST_RUN_REPOS`` for the agent.

Preparing never raises for a repository that cannot be prepared: the run goes on,
and the prompt names that checkout as read-only (a :class:`~prohost.prompt.CheckoutFailure`).

:func:`collect_garbage` removes worktrees of conversations that have been idle for
a while, but never one that holds work that exists nowhere else (uncommitted
changes, or commits on no branch) unless forced.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Literal

import attrs
import trio

from prohost.errors import last_line
from prohost.prompt import Checkout, CheckoutFailure

log = logging.getLogger(__name__)

#: Set in an agent's environment to the folder holding its run's private checkouts.
RUN_REPOS_ENV = "PROHOST_RUN_REPOS"

WORKTREES_DIR = "worktrees"
LANE_MARKER = ".prohost-lane"

#: A `git worktree add` checks out the whole tree (and runs the repo's post-checkout
#: hook, LFS smudging included), so it gets minutes; everything else is quick.
GIT_ADD_TIMEOUT_S = 300.0
GIT_TIMEOUT_S = 60.0
#: A `git worktree remove` runs shielded (a half-deleted worktree looks dirty to the
#: next GC and is worse than either state); this bounds how long that can hold a cancel.
REMOVE_SHIELD_S = 30.0

REPOS_USAGE = "--repos needs a comma-separated list of git checkouts, e.g. --repos ~/code/app"

#: Variables that point git at a particular repository, index or config (what
#: `git rev-parse --local-env-vars` lists). A harness started from a git hook or
#: an editor's terminal can carry them; they would make every command below act
#: on that repository instead of the one named with -C.
_GIT_LOCATION_VARS = frozenset({
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


class ReposFlagError(ValueError):
    """``--repos`` is unusable; the message is one line saying why."""


# --- the --repos flag --------------------------------------------------------------


def _expand_home(raw: str, env: Mapping[str, str]) -> str:
    # `--repos=~/a,~/b` reaches us unexpanded: the shell only expands a leading ~.
    if raw == "~" or raw.startswith("~/"):
        home = env.get("HOME") or str(Path.home())
        return home + raw[1:]
    if raw.startswith("~"):
        expanded = os.path.expanduser(raw)  # ~user/...: the password database knows
        if expanded == raw:
            raise ReposFlagError(f"--repos: no such user in {raw!r}; write the full path")
        return expanded
    return raw


def parse_repos(
    raw: str, *, env: Mapping[str, str], cwd: Path, require_checkouts: bool
) -> tuple[Path, ...]:
    """The checkouts ``--repos`` names: absolute, normalised, first occurrence kept.

    ``require_checkouts`` is for installing a daemon, where a wrong path would only
    show up later in a log nobody reads; ``agent run`` passes False and warns
    instead (see :func:`is_checkout`), since a checkout may appear later.
    """
    if not raw.strip():
        raise ReposFlagError(REPOS_USAGE)
    repos: list[Path] = []
    for entry in raw.split(","):
        entry = entry.strip()
        if not entry:
            # `a,,b` or a trailing comma is almost always a typo for a path.
            raise ReposFlagError(f"{REPOS_USAGE} (got an empty entry in {raw!r})")
        # Absolute now: the agent runs elsewhere, and a daemon has no cwd of ours.
        path = Path(os.path.normpath(cwd / _expand_home(entry, env)))
        if path not in repos:
            repos.append(path)
    if require_checkouts:
        for path in repos:
            if not path.exists():
                raise ReposFlagError(f"--repos: {path} does not exist")
            if not is_checkout(path):
                raise ReposFlagError(f"--repos: {path} is not a git checkout (it has no .git)")
    return tuple(repos)


def is_checkout(path: Path) -> bool:
    """``path`` is the top of a git work tree: it has a ``.git`` folder, or a ``.git``
    file (a worktree or submodule). No subprocess: this runs while parsing flags."""
    dot_git = path / ".git"
    return dot_git.is_dir() or dot_git.is_file()


# --- names -------------------------------------------------------------------------

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_PREFIX_LEN = 32
_LANE_HASH_LEN = 20


def _hash(text: str, length: int) -> str:
    # surrogatepass: a lane id comes from JSON, which can carry a lone surrogate.
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:length]


def lane_folder_name(lane: str) -> str:
    """A folder name for ``lane``: a readable prefix and a hash of the whole lane id.

    The hash makes it unique and stable (the same lane finds its worktrees on every
    turn and after a restart); the prefix, ASCII letters, digits, ``_`` and ``-`` only,
    is there for a person looking at the folder. Neither part can hold ``/``, ``.``
    or be empty, so no lane id can name a path outside the worktrees folder.
    """
    prefix = _UNSAFE.sub("-", lane).strip("-_")[:_PREFIX_LEN].rstrip("-_")
    digest = _hash(lane, _LANE_HASH_LEN)
    return f"{prefix}-{digest}" if prefix else digest


def _base_name(source: Path) -> str:
    # Leading dots dropped: a dotted name would hide the folder and ".prohost-lane"
    # would collide with the marker; "/" has no name at all.
    return source.name.lstrip(".") or "repo"


def _hashed_name(source: Path) -> str:
    return f"{_base_name(source)}-{_hash(str(source), 8)}"


def checkout_names(repos: Sequence[Path]) -> tuple[str, ...]:
    """Each repo's folder name in a lane folder: its base name, or, when two share it,
    the base name plus a hash of the source path.

    A hash rather than the position in ``--repos``, so reordering the flag never
    points a lane's existing ``app-2`` at a different repository. Compared
    case-insensitively: ``App`` and ``app`` are one folder on macOS.
    """
    counts = Counter(_base_name(source).casefold() for source in repos)
    return tuple(
        _base_name(source) if counts[_base_name(source).casefold()] == 1 else _hashed_name(source)
        for source in repos
    )


# --- running git -------------------------------------------------------------------


class GitError(Exception):
    """A git command failed; the message is one short line (git's last stderr line)."""


def git_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment git runs with: ``base`` without repository-locating variables,
    never prompting (a daemon has no terminal to answer on), in the C locale (so the
    ``initializing`` lock git writes, and its messages, read the same everywhere)."""
    env = {
        name: value
        for name, value in (os.environ if base is None else base).items()
        if name not in _GIT_LOCATION_VARS
    }
    env["GIT_TERMINAL_PROMPT"] = "0"
    env["LC_ALL"] = "C"
    return env


async def _kill_group(process: trio.Process) -> None:
    # The whole group, at once: `git worktree add` checks out in a child git and
    # runs hooks, and a SIGTERM to git alone lets it exit (trio then stops waiting)
    # while the child goes on writing into a folder git's own cleanup just removed.
    # What SIGKILL leaves behind, the next prepare clears (see "junk" above).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


async def git(
    *args: str, timeout_s: float = GIT_TIMEOUT_S, env: Mapping[str, str] | None = None
) -> str:
    """Run ``git *args``; return its stdout (decoded as file names are), or raise
    :class:`GitError`. On cancellation or timeout git and every process it started
    are killed (it runs in a process group of its own) before this returns."""
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
        raise GitError(f"git {what} took longer than {timeout_s:g} s and was stopped")
    if done.returncode != 0:
        reason = last_line(done.stderr) or f"git {what} exited with status {done.returncode}"
        raise GitError(reason)
    return os.fsdecode(done.stdout)


def _real(path: Path | str) -> str:
    return os.path.realpath(path)


# --- the lane marker ---------------------------------------------------------------


@attrs.frozen
class LaneMarker:
    """What ``.prohost-lane`` in a lane folder records."""

    lane: str | None
    last_used: float | None
    ready: dict[str, str] | None
    """Checkout name → source, for each worktree a prepare finished and handed to an
    agent. Anything else found in the folder was never used, so it holds no work:
    the leftovers of a cancelled or killed prepare. ``None``: not known."""


def read_marker(folder: Path) -> LaneMarker:
    """``folder``'s marker; a field that is missing or unreadable is ``None``."""
    try:
        data = json.loads((folder / LANE_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return LaneMarker(None, None, None)
    if not isinstance(data, dict):
        return LaneMarker(None, None, None)
    lane = data.get("lane")
    used = data.get("last_used")
    if isinstance(used, bool) or not isinstance(used, int | float) or not math.isfinite(used):
        used = None
    ready = data.get("ready")
    if not (isinstance(ready, dict) and all(isinstance(v, str) for v in ready.values())):
        ready = None
    return LaneMarker(
        lane if isinstance(lane, str) else None,
        float(used) if used is not None else None,
        ready,
    )


def write_marker(folder: Path, marker: LaneMarker) -> None:
    """Create the lane folder and write its marker, atomically: GC may read it at any moment."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f"{LANE_MARKER}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    # ensure_ascii (the default) escapes a lone surrogate a lane id may carry.
    payload = {"lane": marker.lane, "last_used": marker.last_used, "ready": marker.ready}
    try:
        tmp.write_text(json.dumps(payload, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, folder / LANE_MARKER)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _touch_marker(folder: Path, lane: str, now: float) -> LaneMarker:
    """Record a use of the lane now, keeping what the marker knew; return the new marker."""
    # A new lane's folder certainly holds no finished worktree; an existing folder
    # whose marker is unreadable might, so there "ready" stays unknown.
    ready = {} if not folder.exists() else read_marker(folder).ready
    marker = LaneMarker(lane, now, ready)
    write_marker(folder, marker)
    return marker


# --- preparing ---------------------------------------------------------------------


@attrs.frozen
class PreparedCheckouts:
    """What :meth:`WorktreeManager.prepare` made of one lane's checkouts."""

    folder: Path | None
    """The lane's folder when at least one checkout is ready (for ``PROHOST_RUN_REPOS``)."""
    checkouts: tuple[Checkout, ...]
    failures: tuple[CheckoutFailure, ...]


class _LockTimeout(Exception):
    pass


State = Literal["ready", "absent", "half-made", "empty", "broken", "foreign", "junk"]


class WorktreeManager:
    """Gives each lane its own worktree of every ``--repos`` checkout.

    One per harness. Runs of one lane never overlap (the scheduler sees to that),
    so only one task at a time touches a given lane folder; different lanes share
    the source repositories, whose worktree bookkeeping (``.git/worktrees``) is only
    changed under a per-source lock.
    """

    def __init__(
        self, home: Path, repos: Sequence[Path], *, lock_timeout_s: float = 60.0
    ) -> None:
        self.root = home / WORKTREES_DIR
        self.repos = tuple(repos)
        self.names = checkout_names(self.repos)
        self.lock_timeout_s = lock_timeout_s
        self._locks: dict[str, trio.Lock] = {}
        # A checkout's common dir only changes if it is re-cloned; asking once per
        # source keeps a reused worktree at one git process per turn.
        self._common_dirs: dict[Path, str] = {}

    @property
    def enabled(self) -> bool:
        return bool(self.repos)

    def source_lock(self, source: Path) -> trio.Lock:
        """The lock held while worktrees of ``source`` are created, repaired or removed."""
        return self._locks.setdefault(str(source), trio.Lock())

    def lane_folder(self, lane: str) -> Path:
        return self.root / lane_folder_name(lane)

    async def prepare(self, lane: str) -> PreparedCheckouts:
        """Make sure ``lane`` has a worktree of each repo; say which are ready and why
        the others are not. Never raises for a repository; all repos are prepared at once.

        Cancelled: git processes in flight are killed (their whole process group),
        per-source locks are released, and what a half-made worktree leaves behind
        is cleared by the lane's next prepare (it was never handed to an agent).
        """
        folder = self.lane_folder(lane)
        try:
            # First, so a GC deciding at this moment sees the lane as just used.
            marker = await trio.to_thread.run_sync(_touch_marker, folder, lane, time.time())
        except OSError as exc:
            reason = f"could not create {folder}: {exc.strerror or exc}"
            failures = tuple(CheckoutFailure(str(source), reason) for source in self.repos)
            return PreparedCheckouts(folder=None, checkouts=(), failures=failures)

        results: list[Checkout | CheckoutFailure | None] = [None] * len(self.repos)

        async def one(index: int) -> None:
            results[index] = await self._prepare_one(
                folder, self.repos[index], self.names[index], marker.ready
            )

        async with trio.open_nursery() as nursery:
            for index in range(len(self.repos)):
                nursery.start_soon(one, index)
        checkouts = tuple(r for r in results if isinstance(r, Checkout))
        failures = tuple(r for r in results if isinstance(r, CheckoutFailure))
        ready = dict(marker.ready or {})
        ready.update((checkout.name, checkout.source) for checkout in checkouts)
        if ready != marker.ready:
            try:
                # Only now: a worktree is "ready" once it is about to be handed over.
                await trio.to_thread.run_sync(
                    write_marker, folder, attrs.evolve(marker, ready=ready)
                )
            except OSError as exc:
                log.warning("could not record the checkouts of %s: %s", lane, exc)
        return PreparedCheckouts(
            folder=folder if checkouts else None, checkouts=checkouts, failures=failures
        )

    async def _prepare_one(
        self, folder: Path, source: Path, name: str, ready: Mapping[str, str] | None
    ) -> Checkout | CheckoutFailure:
        try:
            if not await trio.to_thread.run_sync(source.is_dir):
                return CheckoutFailure(str(source), "no such directory")
            if not await trio.to_thread.run_sync(is_checkout, source):
                return CheckoutFailure(str(source), "not a git checkout")
            common = await self._common_dir(source)
            path = folder / name
            state = await self._inspect(path, common)
            if state == "foreign" and name != _hashed_name(source):
                # The folder holds a worktree of another repository that used to
                # have this name (--repos changed). It may hold that conversation's
                # work, so it is left alone and this repo takes its hashed name.
                name = _hashed_name(source)
                path = folder / name
                state = await self._inspect(path, common)
            if state == "foreign":
                return CheckoutFailure(
                    str(source), f"{path} already holds a worktree of another repository"
                )
            if ready is not None and name in ready and state == "half-made":
                # Finished and handed over before, so that lock is someone's own
                # `git worktree lock`, not git's mark of an unfinished checkout.
                state = "ready"
            if state not in ("ready", "absent") and ready is not None and name not in ready:
                # Unusable and never handed to an agent: a prepare was cancelled or
                # killed while making it, so nothing in it is anyone's work.
                state = "junk"
            if state != "ready":
                await self._create(source, path, state)
            return Checkout(name=name, path=str(path), source=str(source))
        except _LockTimeout:
            return CheckoutFailure(
                str(source),
                f"another worktree of {source} was still being created after "
                f"{self.lock_timeout_s:g} s",
            )
        except GitError as exc:
            return CheckoutFailure(str(source), str(exc))
        except OSError as exc:
            return CheckoutFailure(str(source), f"{exc.strerror or exc}")

    async def _common_dir(self, source: Path) -> str:
        cached = self._common_dirs.get(source)
        if cached is not None:
            return cached
        out = await git("-C", str(source), "rev-parse", "--git-common-dir")
        # Relative to `source` on gits before 2.31's --path-format; joining copes with both.
        common = _real(source / out.strip())
        self._common_dirs[source] = common
        return common

    async def _inspect(self, path: Path, common: str) -> State:
        """What is at ``path``: a usable worktree of the repo whose common dir is
        ``common``, nothing, or one of the ways a worktree can be unusable."""
        if not await trio.to_thread.run_sync(os.path.lexists, path):
            return "absent"
        if not await trio.to_thread.run_sync(path.is_dir):
            return "broken"
        if not await trio.to_thread.run_sync(os.path.lexists, path / ".git"):
            # A `git worktree add` killed before it wrote anything leaves this.
            empty = not await trio.to_thread.run_sync(lambda: any(path.iterdir()))
            return "empty" if empty else "broken"
        try:
            out = await git(
                "-C", str(path), "rev-parse", "--show-toplevel", "--git-common-dir", "--git-dir"
            )
        except GitError:
            return "broken"  # its .git points at bookkeeping that no longer exists
        lines = out.splitlines()
        if len(lines) != 3:
            return "broken"
        toplevel, their_common, git_dir = lines
        # Without the toplevel check, a folder inside some other work tree (a home
        # directory kept in git) would pass as a worktree of that one.
        if _real(toplevel) != _real(path):
            return "broken"
        if _real(path / their_common) != common:
            return "foreign"
        # git writes this lock first and removes it last; a worktree still holding
        # it was killed mid-checkout and has a partial tree (LC_ALL=C: see git_env).
        lock_file = path / git_dir / "locked"
        try:
            reason = await trio.to_thread.run_sync(lock_file.read_text)
        except OSError:
            return "ready"
        return "half-made" if reason.strip() == "initializing" else "ready"

    async def _create(self, source: Path, path: Path, state: State) -> None:
        log.debug("making the worktree %s of %s (found: %s)", path, source, state)
        if state == "empty":
            await trio.to_thread.run_sync(path.rmdir)
        elif state == "broken":
            # Not a worktree any more, but it was handed to an agent and may hold
            # its files: moved aside, not deleted. GC treats it like a dirty worktree.
            aside = path.with_name(f"{path.name}.orphaned-{int(time.time())}")
            await trio.to_thread.run_sync(path.rename, aside)
            log.warning("%s was not a usable git worktree; moved it to %s", path, aside)
        src = str(source)
        lock = self.source_lock(source)
        acquired = False
        with trio.move_on_after(self.lock_timeout_s):
            await lock.acquire()
            acquired = True
        if not acquired:
            raise _LockTimeout
        try:
            if state in ("half-made", "junk"):
                if await trio.to_thread.run_sync(os.path.lexists, path / ".git"):
                    # Twice --force: git's "initializing" lock is a lock too.
                    with contextlib.suppress(GitError):
                        await git("-C", src, "worktree", "remove", "--force", "--force", str(path))
                if await trio.to_thread.run_sync(os.path.lexists, path):
                    await trio.to_thread.run_sync(shutil.rmtree, path)
            # Clears the registration of a worktree whose folder vanished; `add`
            # refuses a path that is "missing but already registered".
            await git("-C", src, "worktree", "prune")
            await git(
                "-C", src, "worktree", "add", "--detach", str(path), "HEAD",
                timeout_s=GIT_ADD_TIMEOUT_S,
            )
        finally:
            lock.release()


# --- garbage collection ------------------------------------------------------------

GcAction = Literal["removed", "kept-dirty", "kept-unmerged", "kept-busy", "kept-recent",
                   "would-remove"]


@attrs.frozen
class GcEntry:
    """What :func:`collect_garbage` did with one lane folder, and why."""

    lane_folder: Path
    lane: str | None
    """From the folder's marker; ``None`` when it has none that is readable."""
    idle_s: float
    worktrees: tuple[Path, ...]
    action: GcAction
    detail: str


@attrs.frozen
class _Verdict:
    path: Path
    common: str | None
    problem: Literal["dirty", "unmerged"] | None
    detail: str


def _scan_folder(folder: Path) -> tuple[list[Path], list[str]]:
    """The worktrees in a lane folder, and the names of anything else that is not ours."""
    worktrees: list[Path] = []
    others: list[str] = []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith(LANE_MARKER):
            continue
        if entry.is_dir() and not entry.is_symlink() and os.path.lexists(entry / ".git"):
            worktrees.append(entry)
        else:
            others.append(entry.name)
    return worktrees, others


def _idle_since(folder: Path) -> tuple[str | None, float]:
    marker = read_marker(folder)
    lane, used = marker.lane, marker.last_used
    if used is None:
        used = folder.stat().st_mtime
    return lane, used


async def _judge(path: Path) -> _Verdict:
    """Whether removing the worktree at ``path`` would lose work."""
    try:
        out = await git("-C", str(path), "rev-parse", "--show-toplevel", "--git-common-dir")
        toplevel, common = out.splitlines()[:2]
        if _real(toplevel) != _real(path):
            raise GitError("it is not the top of a git worktree")
        env = git_env()
        env["GIT_OPTIONAL_LOCKS"] = "0"  # a read-only look; never take index.lock
        # Untracked files and changed submodules count (whatever the repo's config
        # says): removing the worktree would delete them too.
        status = await git(
            "-C", str(path), "status", "--porcelain", "--untracked-files=normal",
            "--ignore-submodules=none", env=env,
        )
    except (GitError, ValueError) as exc:
        return _Verdict(path, None, "dirty", f"{path.name} cannot be checked ({exc})")
    common_dir = _real(path / common)
    changed = [line for line in status.splitlines() if line.strip()]
    if changed:
        noun = "file" if len(changed) == 1 else "files"
        detail = f"{path.name} has uncommitted changes ({len(changed)} {noun})"
        return _Verdict(path, common_dir, "dirty", detail)
    try:
        # A branch (local or remote-tracking) containing HEAD keeps its commits alive
        # after the worktree goes; a branch made in the worktree lives in the source.
        holders = await git(
            "-C", str(path), "for-each-ref", "--contains", "HEAD", "--count=1",
            "--format=%(refname)", "refs/heads", "refs/remotes",
        )
    except GitError as exc:
        return _Verdict(path, common_dir, "unmerged", f"{path.name} cannot be checked ({exc})")
    if not holders.strip():
        return _Verdict(
            path, common_dir, "unmerged",
            f"{path.name} has commits on no branch, which removing it would lose",
        )
    return _Verdict(path, common_dir, None, "")


def _days(seconds: float) -> str:
    days = seconds / 86400
    return f"{days:.1f} days" if days < 10 else f"{days:.0f} days"


async def _remove_worktree(verdict: _Verdict, force: bool) -> None:
    """Remove one worktree, shielded and bounded: half-deleted is worse than either."""
    with trio.CancelScope(shield=True, deadline=trio.current_time() + REMOVE_SHIELD_S):
        if verdict.common is None:
            # Its repository is gone, so git cannot remove it; only --force gets here.
            await trio.to_thread.run_sync(shutil.rmtree, verdict.path)
            return
        args = ["--git-dir", verdict.common, "worktree", "remove"]
        if force:
            args += ["--force", "--force"]  # twice: also a locked one
        await git(*args, str(verdict.path), timeout_s=REMOVE_SHIELD_S)


async def collect_garbage(
    home: Path,
    *,
    older_than_s: float,
    dry_run: bool,
    force: bool,
    busy: Callable[[str], bool] = lambda lane: False,
    hold: Callable[[str], AbstractAsyncContextManager[None]] | None = None,
    now: float | None = None,
) -> list[GcEntry]:
    """Remove the worktrees of lanes idle for more than ``older_than_s``; one entry per
    lane folder saying what was done and why.

    A lane folder goes whole or not at all: a worktree with uncommitted changes (or
    anything else in the folder that is not ours) or with commits on no branch keeps
    its folder unless ``force``; ``busy(lane)`` true keeps it always. Removal is
    ``git worktree remove``, then ``git worktree prune`` on each source touched.
    ``dry_run`` removes nothing and reports ``would-remove``. ``hold(lane)``, when
    given (the harness's scheduler), is entered around the last look and the
    removal, so no turn of that lane starts while its worktrees go; a turn that
    arrives meanwhile starts afterwards and prepares them afresh.

    Cancelled: the worktree being removed is finished (shielded, bounded by
    :data:`REMOVE_SHIELD_S`); the rest are left for the next collection.
    """
    root = home / WORKTREES_DIR
    now = time.time() if now is None else now
    try:
        folders = await trio.to_thread.run_sync(
            lambda: sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())
        )
    except FileNotFoundError:
        return []
    entries: list[GcEntry] = []
    for folder in folders:
        try:
            lane, used = await trio.to_thread.run_sync(_idle_since, folder)
            worktrees, others = await trio.to_thread.run_sync(_scan_folder, folder)
        except FileNotFoundError:
            continue  # removed while we looked (another collection)
        idle_s = max(0.0, now - used)

        def entry(action: GcAction, detail: str) -> GcEntry:
            return GcEntry(folder, lane, idle_s, tuple(worktrees), action, detail)  # noqa: B023

        if lane is not None and busy(lane):
            entries.append(entry("kept-busy", "a run of this conversation is queued or running"))
            continue
        if idle_s <= older_than_s:
            entries.append(entry("kept-recent", f"last used {_days(idle_s)} ago"))
            continue
        verdicts = [await _judge(path) for path in worktrees]
        problems = [v for v in verdicts if v.problem is not None]
        notes = [v.detail for v in problems]
        if others:
            notes.append(f"the folder also holds {', '.join(others[:5])}")
        if (problems or others) and not force:
            dirty = others or any(v.problem == "dirty" for v in problems)
            action: GcAction = "kept-dirty" if dirty else "kept-unmerged"
            entries.append(entry(action, "; ".join(notes) + "; --force removes it anyway"))
            continue
        names = ", ".join(p.name for p in worktrees) or "no worktrees"
        forced = f" (forced: {'; '.join(notes)})" if notes else ""
        if dry_run:
            entries.append(entry("would-remove", f"would remove {names}{forced}"))
            continue
        async with (
            hold(lane) if hold is not None and lane is not None else contextlib.nullcontext()
        ):
            # Looked at again just before acting: a turn may have started meanwhile.
            # With the lane held, none can start from here until the removal is done.
            lane_now, used_now = await trio.to_thread.run_sync(_idle_since, folder)
            if (lane_now is not None and busy(lane_now)) or used_now != used:
                entries.append(entry("kept-busy", "the conversation was used while GC ran"))
                continue
            entries.append(await _remove_folder(folder, verdicts, force, bool(others), entry,
                                                names, forced))
    return entries


async def _remove_folder(
    folder: Path,
    verdicts: list[_Verdict],
    force: bool,
    has_others: bool,
    entry: Callable[[GcAction, str], GcEntry],
    names: str,
    forced: str,
) -> GcEntry:
    touched: set[str] = set()
    failed: list[str] = []
    for verdict in verdicts:
        try:
            # --force only where it was asked for: a clean one that changed since
            # it was judged makes git refuse, and it is kept.
            await _remove_worktree(verdict, verdict.problem is not None)
        except (GitError, OSError) as exc:
            failed.append(f"{verdict.path.name}: {exc}")
        if verdict.common is not None:
            touched.add(verdict.common)
    for common in sorted(touched):
        with contextlib.suppress(GitError):
            # Tidies the source's list; a failure here leaves a stale entry that
            # the next `git worktree prune` (or git gc) clears, nothing worse.
            await git("--git-dir", common, "worktree", "prune")
    if failed:
        return entry("kept-dirty", "could not remove " + "; ".join(failed))

    def clear() -> None:
        if force and has_others:
            shutil.rmtree(folder)
            return
        for marker in folder.glob(f"{LANE_MARKER}*"):
            marker.unlink()
        folder.rmdir()

    try:
        await trio.to_thread.run_sync(clear)
    except OSError as exc:
        return entry("removed", f"removed {names}{forced}, but not the folder: {exc.strerror}")
    return entry("removed", f"removed {names}{forced}")
