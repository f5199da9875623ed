"""Collecting the private worktrees of conversations gone quiet (``agent gc``, and
the harness's daily pass).

:func:`collect_garbage` removes worktrees of conversations that have been idle for
a while, but never one that holds work that exists nowhere else (uncommitted
changes, or commits on no branch) unless forced. The worktrees themselves are
:mod:`prohost.engine.repos.worktrees`'s.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Literal

import attrs
import trio

from prohost.engine.blocking import Bounds
from prohost.engine.repos.gitcmd import GitError, GitTimedOut, git, git_env, real_path
from prohost.engine.repos.worktrees import LANE_MARKER, WORKTREES_DIR, read_marker

log = logging.getLogger("prohost.worktrees")

#: A `git worktree remove` runs shielded (a half-deleted worktree looks dirty to the
#: next GC and is worse than either state); this bounds how long that can hold a cancel.
REMOVE_SHIELD_S = 30.0


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
        if real_path(toplevel) != real_path(path):
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
    common_dir = real_path(path / common)
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
        if not isinstance(exc, GitTimedOut) and await _unborn(path):
            # An empty repository's worktree whose branch has no commit yet, and
            # nothing uncommitted (above): there is nothing to lose.
            return _Verdict(path, common_dir, None, "")
        return _Verdict(path, common_dir, "unmerged", f"{path.name} cannot be checked ({exc})")
    if not holders.strip():
        return _Verdict(
            path, common_dir, "unmerged",
            f"{path.name} has commits on no branch, which removing it would lose",
        )
    return _Verdict(path, common_dir, None, "")


async def _unborn(path: Path) -> bool:
    """Whether the worktree at ``path`` is on a branch with no commit yet."""
    try:
        await git("-C", str(path), "symbolic-ref", "--quiet", "HEAD")
    except GitError:
        return False  # detached, or unreadable
    try:
        await git("-C", str(path), "rev-parse", "--verify", "--quiet", "HEAD")
    except GitTimedOut:
        return False
    except GitError:
        return True
    return False


#: Keeps a lane from starting runs for a block (the harness's scheduler's ``holding``).
Holding = Callable[[str], AbstractAsyncContextManager[None]]


def _lane_folders(root: Path) -> list[Path]:
    """Blocking: the lane folders under ``root``, sorted (symlinks are never ours)."""
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())


def _days(seconds: float) -> str:
    days = seconds / 86400
    return f"{days:.1f} days" if days < 10 else f"{days:.0f} days"


async def _remove_worktree(verdict: _Verdict, force: bool, bounds: Bounds) -> None:
    """Remove one worktree, shielded and bounded: half-deleted is worse than either."""
    with trio.CancelScope(shield=True, deadline=trio.current_time() + REMOVE_SHIELD_S):
        if verdict.common is None:
            # Its repository is gone, so git cannot remove it; only --force gets here.
            await bounds.file_step(shutil.rmtree, verdict.path, limit_s=REMOVE_SHIELD_S,
                                   what=f"removing {verdict.path}")
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
    hold: Holding | None = None,
    now: float | None = None,
    bounds: Bounds | None = None,
) -> list[GcEntry]:
    """Remove the worktrees of lanes idle for more than ``older_than_s``; one entry per
    lane folder saying what was done and why.

    A lane folder goes whole or not at all: a worktree with uncommitted changes (or
    anything else in the folder that is not ours) or with commits on no branch keeps
    its folder unless ``force``; ``busy(lane)`` true keeps it always. Removal is
    ``git worktree remove``, which also clears the worktree's registration in its
    source; ``git worktree prune`` is never run here (it would also forget the
    person's own worktrees whose folders are missing, an unmounted disk's).
    ``dry_run`` removes nothing and reports ``would-remove``. ``hold(lane)``, when
    given (the harness's scheduler), is entered around the last look and the
    removal, so no turn of that lane starts while its worktrees go; a turn that
    arrives meanwhile starts afterwards and prepares them afresh.

    Every file step goes through ``bounds`` (the harness's, which the second
    signal hurries; a fresh one if ``None``): a hung disk raises
    :class:`~prohost.engine.blocking.StepTimedOut` (an ``OSError``) at its bound
    instead of holding the caller.

    Cancelled: the worktree being removed is finished (shielded, bounded by
    :data:`REMOVE_SHIELD_S`); the rest are left for the next collection.
    """
    root = home / WORKTREES_DIR
    now = time.time() if now is None else now
    bounds = bounds if bounds is not None else Bounds()
    try:
        folders = await bounds.file_step(_lane_folders, root, what=f"listing {root}")
    except FileNotFoundError:
        return []
    entries: list[GcEntry] = []
    for folder in folders:
        try:
            lane, used = await bounds.file_step(_idle_since, folder, what=f"reading {folder}")
            worktrees, others = await bounds.file_step(_scan_folder, folder,
                                                       what=f"listing {folder}")
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
            lane_now, used_now = await bounds.file_step(_idle_since, folder,
                                                        what=f"reading {folder}")
            if (lane_now is not None and busy(lane_now)) or used_now != used:
                entries.append(entry("kept-busy", "the conversation was used while GC ran"))
                continue
            entries.append(await _remove_folder(folder, verdicts, force, bool(others), entry,
                                                names, forced, bounds))
    return entries


async def _remove_folder(
    folder: Path,
    verdicts: list[_Verdict],
    force: bool,
    has_others: bool,
    entry: Callable[[GcAction, str], GcEntry],
    names: str,
    forced: str,
    bounds: Bounds,
) -> GcEntry:
    failed: list[str] = []
    for verdict in verdicts:
        try:
            # --force only where it was asked for: a clean one that changed since
            # it was judged makes git refuse, and it is kept.
            await _remove_worktree(verdict, verdict.problem is not None, bounds)
        except (GitError, OSError) as exc:
            failed.append(f"{verdict.path.name}: {exc}")
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
        await bounds.file_step(clear, what=f"removing {folder}")
    except OSError as exc:
        return entry("removed", f"removed {names}{forced}, but not the folder: {exc.strerror}")
    return entry("removed", f"removed {names}{forced}")
