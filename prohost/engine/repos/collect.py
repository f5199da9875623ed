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
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Literal

import attrs
import trio

from prohost.engine.blocking import Bounds
from prohost.engine.repos.gitcmd import GitError, GitPlaces, GitTimedOut, git, real_path
from prohost.engine.repos.gitrecords import adopt_git_dir, own_git_dir, planted_worktree_config
from prohost.engine.repos.gitsession import PLAIN_GIT, Confine, ConfinedGit, Git
from prohost.engine.repos.lanemarker import LANE_MARKER, read_marker
from prohost.engine.repos.lanerepo import REPOS_FOLDER
from prohost.engine.repos.worktrees import WORKTREES_DIR, lane_folder_name

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
    #: Its git dir and common dir, from the lane marker (``None``: none known).
    git: GitPlaces | None
    problem: Literal["dirty", "unmerged"] | None
    detail: str


def _scan_folder(folder: Path) -> tuple[list[Path], list[str]]:
    """The worktrees in a lane folder, and the names of anything else that is not ours."""
    worktrees: list[Path] = []
    others: list[str] = []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith(LANE_MARKER) or entry.name == REPOS_FOLDER:
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


async def _person_common(folder: Path, name: str) -> str | None:
    """The common dir of the person's repository the checkout ``name`` of the lane
    folder ``folder`` stands for (its marker names the source)."""
    source = (read_marker(folder).ready or {}).get(name)
    if source is None:
        return None
    try:
        out = await git("-C", source, "rev-parse", "--git-common-dir")
    except GitError:
        return None
    return real_path(Path(source) / out.strip())


async def _at(run: Git, places: GitPlaces, *args: str,
              ok_codes: tuple[int, ...] = (0,)) -> str:
    """``git *args`` on the worktree at ``places`` (every path named from the
    records, as :func:`~prohost.engine.repos.gitcmd.git_at`), through ``run``."""
    return await run(*places.args(), *args, env=places.env(), ok_codes=ok_codes)


async def _brought_back(folder: Path, places: GitPlaces, run: Git) -> bool:
    """Whether the commit the worktree at ``places`` is on is in the person's
    repository (brought back after its last run): always, for a worktree of the
    person's repository (made by an earlier version)."""
    person = await _person_common(folder, Path(places.work_tree).name)
    if person is None or person == places.common_dir:
        return person is not None
    head = (await _at(run, places, "rev-parse", "--verify", "--quiet", "HEAD^{commit}",
                      ok_codes=(0, 1))).strip()
    if not head:
        return True  # no commit yet: nothing to lose
    try:
        await git("--git-dir", person, "cat-file", "-e", f"{head}^{{commit}}")
    except GitError:
        return False
    return True


async def _places(folder: Path, path: Path) -> GitPlaces | None:
    """The worktree at ``path``'s git places from its lane marker (§13: never from
    its ``.git`` file, which its run could have rewritten); for one made by an
    earlier version, adopted as the harness would (its source is in the marker).
    ``None``: not known, so not checked."""
    marker = read_marker(folder)
    recorded = (marker.git_dirs or {}).get(path.name)
    if recorded is not None:
        common = os.path.dirname(os.path.dirname(recorded))
        return GitPlaces(str(path), recorded, common) if own_git_dir(recorded, common) else None
    person = await _person_common(folder, path.name)
    if person is None:
        return None
    adopted, _ = adopt_git_dir(path, person)
    return GitPlaces(str(path), adopted, person) if adopted is not None else None


def _checked_out(path: Path, submodules: list[str]) -> list[str]:
    """Those of ``submodules`` with a ``.git`` in the worktree at ``path`` (a few
    ``lstat`` calls, on a worktree just read by git)."""
    return [name for name in submodules if os.path.lexists(path / name / ".git")]


async def _judge(folder: Path, path: Path, run: Git = PLAIN_GIT) -> _Verdict:
    """Whether removing the worktree at ``path`` would lose work; its git through
    ``run`` (inside a confinement where runs are confined by bubblewrap)."""
    places = await _places(folder, path)
    if places is None:
        return _Verdict(path, None, "dirty", f"{path.name} cannot be checked (the harness "
                                              "has no record of its git dir)")
    if not run.confined and planted_worktree_config(places):
        return _Verdict(path, places, "dirty",
                        f"{path.name} cannot be checked outside a confinement (its git dir "
                        "holds a config.worktree that a run wrote)")
    try:
        # Untracked files count (whatever the repo's config says): removing the
        # worktree would delete them too. A read-only look: never take index.lock.
        # Submodules: their commits only. For their files git would run a `git
        # status` inside each, with the config and attributes (filter programs)
        # of a repository the run may have planted there (§13); one checked out
        # counts as work instead (below).
        status = await _at(
            run, places, "--no-optional-locks", "status", "--porcelain",
            "--untracked-files=normal", "--ignore-submodules=dirty",
        )
        staged = await _at(run, places, "ls-files", "-z", "--stage")
    except (GitError, ValueError) as exc:
        return _Verdict(path, places, "dirty", f"{path.name} cannot be checked ({exc})")
    nested = [entry.split("\t", 1)[1] for entry in staged.split("\0")
              if entry.startswith("160000 ") and "\t" in entry]
    nested = _checked_out(path, nested)
    if nested:
        return _Verdict(path, places, "dirty",
                        f"{path.name} holds a checked-out submodule ({nested[0]}), whose "
                        "work is not looked at")
    changed = [line for line in status.splitlines() if line.strip()]
    if changed:
        noun = "file" if len(changed) == 1 else "files"
        detail = f"{path.name} has uncommitted changes ({len(changed)} {noun})"
        return _Verdict(path, places, "dirty", detail)
    try:
        # A branch (local or remote-tracking) containing HEAD keeps its commits alive
        # after the worktree goes; a branch made in the worktree lives in the source.
        holders = await _at(
            run, places, "for-each-ref", "--contains", "HEAD", "--count=1",
            "--format=%(refname)", "refs/heads", "refs/remotes",
        )
    except GitError as exc:
        if not isinstance(exc, GitTimedOut) and await _unborn(places, run):
            # An empty repository's worktree whose branch has no commit yet, and
            # nothing uncommitted (above): there is nothing to lose.
            return _Verdict(path, places, None, "")
        return _Verdict(path, places, "unmerged", f"{path.name} cannot be checked ({exc})")
    if not holders.strip():
        return _Verdict(
            path, places, "unmerged",
            f"{path.name} has commits on no branch, which removing it would lose",
        )
    try:
        back = await _brought_back(folder, places, run)
    except GitError as exc:
        return _Verdict(path, places, "unmerged", f"{path.name} cannot be checked ({exc})")
    if not back:
        return _Verdict(path, places, "unmerged",
                        f"{path.name} has commits its repository's branch does not have "
                        "yet, which removing it would lose")
    return _Verdict(path, places, None, "")


async def _unborn(places: GitPlaces, run: Git) -> bool:
    """Whether the worktree at ``places`` is on a branch with no commit yet."""
    try:
        await _at(run, places, "symbolic-ref", "--quiet", "HEAD")
    except GitError:
        return False  # detached, or unreadable
    try:
        await _at(run, places, "rev-parse", "--verify", "--quiet", "HEAD")
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


def _remove_files(verdict: _Verdict) -> None:
    """Blocking: the worktree's folder, then its git dir in the source (what
    ``git worktree remove`` does), each removed without following a link. No git
    runs: everything in both is what a run could have written (§13)."""
    shutil.rmtree(verdict.path)
    if verdict.git is not None:
        shutil.rmtree(verdict.git.git_dir, ignore_errors=True)


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
    confine: Confine | None = None,
    scratch_root: Path | None = None,
    with_folder: Callable[[str], None] | None = None,
) -> list[GcEntry]:
    """Remove the worktrees of lanes idle for more than ``older_than_s``; one entry per
    lane folder saying what was done and why.

    A lane folder goes whole or not at all: a worktree with uncommitted changes (or
    anything else in the folder that is not ours) or with commits on no branch keeps
    its folder unless ``force``; ``busy(lane)`` true keeps it always. Removal is
    the worktree's folder and its registration in its source (its git dir, as
    ``git worktree remove`` would); ``git worktree prune`` is never run here (it
    would also forget the person's own worktrees whose folders are missing, an
    unmounted disk's).
    No git runs on what a run could have written but with the places the lane's
    marker records (§13), and removal is the harness's own, following no link.
    ``dry_run`` removes nothing and reports ``would-remove``. ``hold(lane)``, when
    given (the harness's scheduler), is entered around the last look and the
    removal, so no turn of that lane starts while its worktrees go; a turn that
    arrives meanwhile starts afterwards and prepares them afresh.

    ``with_folder(name)``, when given, removes what else is the conversation's
    whose agent folders are keyed ``name`` (:func:`lane_folder_name` of the lane
    its marker names; its agent CLI folders and sessions,
    ``prohost.engine.run.leftovers.conversation_folders``), with that folder.

    With ``confine`` (where runs are confined by bubblewrap), the git that looks
    at a lane's worktrees runs inside a confinement like its runs' (one process
    per lane folder, which alone it may read, with the person's repositories;
    its scratch under ``scratch_root``, default ``home/runs``): what the lane's
    runs left there (settings, filters, a submodule's repository) acts with a
    run's rights at most. Without, git runs with the overrides of
    :mod:`prohost.engine.repos.gitcmd`, and a worktree whose git dir holds a
    ``config.worktree`` is kept unread.

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
    collection = _Collection(dry_run=dry_run, force=force, busy=busy, hold=hold,
                             bounds=bounds, with_folder=with_folder)
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
        async with _reading(folder, home, confine, scratch_root) as run:
            entries.append(await collection.lane_folder(folder, worktrees, others, entry,
                                                        run, lane, used))
    return entries


@contextlib.asynccontextmanager
async def _reading(folder: Path, home: Path, confine: Confine | None,
                   scratch_root: Path | None) -> AsyncIterator[Git]:
    """Where the git that looks at the lane folder ``folder`` runs (see
    :func:`collect_garbage`); its process ends with the block."""
    if confine is None:
        yield PLAIN_GIT
        return
    sources = [Path(source) for source in (read_marker(folder).ready or {}).values()]
    async with ConfinedGit(confine, [folder, *sources],
                           scratch_root or home / "runs") as run:
        yield run


@attrs.frozen(eq=False)
class _Collection:
    """One :func:`collect_garbage` call's choices, made once: what it may remove
    (``dry_run``, ``force``), what keeps a lane (``busy``, ``hold``), the bounds its
    file steps go through, and what else goes with a lane folder (``with_folder``)."""

    dry_run: bool
    force: bool
    busy: Callable[[str], bool]
    hold: Holding | None
    bounds: Bounds
    with_folder: Callable[[str], None] | None

    async def lane_folder(self, folder: Path, worktrees: list[Path], others: list[str],
                          entry: Callable[[GcAction, str], GcEntry], run: Git,
                          lane: str | None, used: float) -> GcEntry:
        """What to do with one idle lane folder, done (see :func:`collect_garbage`)."""
        force, hold = self.force, self.hold
        verdicts = [await _judge(folder, path, run) for path in worktrees]
        problems = [v for v in verdicts if v.problem is not None]
        notes = [v.detail for v in problems]
        if others:
            notes.append(f"the folder also holds {', '.join(others[:5])}")
        if (problems or others) and not force:
            dirty = others or any(v.problem == "dirty" for v in problems)
            action: GcAction = "kept-dirty" if dirty else "kept-unmerged"
            return entry(action, "; ".join(notes) + "; --force removes it anyway")
        names = ", ".join(p.name for p in worktrees) or "no worktrees"
        forced = f" (forced: {'; '.join(notes)})" if notes else ""
        if self.dry_run:
            return entry("would-remove", f"would remove {names}{forced}")
        async with (
            hold(lane) if hold is not None and lane is not None else contextlib.nullcontext()
        ):
            # Looked at again just before acting: a turn may have started meanwhile.
            # With the lane held, none can start from here until the removal is done.
            lane_now, used_now = await self.bounds.file_step(_idle_since, folder,
                                                             what=f"reading {folder}")
            if (lane_now is not None and self.busy(lane_now)) or used_now != used:
                return entry("kept-busy", "the conversation was used while GC ran")
            return await self._remove_folder(folder, verdicts, bool(others), entry,
                                             names, forced, run)

    async def _remove_folder(self, folder: Path, verdicts: list[_Verdict], has_others: bool,
                             entry: Callable[[GcAction, str], GcEntry], names: str,
                             forced: str, run: Git) -> GcEntry:
        failed: list[str] = []
        for verdict in verdicts:
            try:
                # --force only where it was asked for: a clean one that changed since
                # it was judged makes git refuse, and it is kept.
                await self._remove_worktree(verdict, verdict.problem is not None, run)
            except (GitError, OSError) as exc:
                failed.append(f"{verdict.path.name}: {exc}")
        if failed:
            return entry("kept-dirty", "could not remove " + "; ".join(failed))
        force, with_folder = self.force, self.with_folder

        def clear() -> None:
            if with_folder is not None:
                # The agent folders are keyed by the lane, whatever the worktrees'
                # folder is called (a readable name, or an earlier version's).
                lane = read_marker(folder).lane
                with_folder(lane_folder_name(lane) if lane is not None else folder.name)
            if force and has_others:
                shutil.rmtree(folder)
                return
            # The lane's own repositories: their branches are in the person's now.
            if os.path.lexists(folder / REPOS_FOLDER):
                shutil.rmtree(folder / REPOS_FOLDER)
            for marker in folder.glob(f"{LANE_MARKER}*"):
                marker.unlink()
            folder.rmdir()

        try:
            await self.bounds.file_step(clear, what=f"removing {folder}")
        except OSError as exc:
            return entry("removed",
                         f"removed {names}{forced}, but not the folder: {exc.strerror}")
        return entry("removed", f"removed {names}{forced}")

    async def _remove_worktree(self, verdict: _Verdict, force: bool, run: Git) -> None:
        """Remove one worktree, shielded and bounded: half-deleted is worse than either.
        Unforced, one that changed since it was judged is kept (raises GitError)."""
        with trio.CancelScope(shield=True, deadline=trio.current_time() + REMOVE_SHIELD_S):
            if not force:
                again = await _judge(verdict.path.parent, verdict.path, run)
                if again.problem is not None:
                    raise GitError(again.detail)
            await self.bounds.file_step(_remove_files, verdict, limit_s=REMOVE_SHIELD_S,
                                        what=f"removing {verdict.path}")
