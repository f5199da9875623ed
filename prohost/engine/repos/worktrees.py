"""Private git worktrees for each conversation (§5.1).

Why: with ``--concurrency`` above 1, two conversations' agents would otherwise do
their git work in the same checkout. One switches branch under the other, one
commits the other's half-edited files, and ``git stash`` pops into the wrong run.
So every lane gets, for each ``--repos`` checkout, a worktree of its own::

    $PROHOST_HOME/worktrees/<lane folder>/<repo name>      (on the branch prohost/<lane folder>)
    $PROHOST_HOME/worktrees/<lane folder>/.prohost-lane    (lane id and last use, for GC)

The lane folder's name is one a person types: the conversation's (a lone run's:
its run id), made safe, with a short suffix only where two would collide; which
lane has which name is the harness's record (:mod:`prohost.engine.repos.lanenames`),
so the folders an earlier version named ``conv-<id>-<20 hex>`` are found as they are.
A run without a conversation that committed nothing leaves no folder and no branch
behind (:meth:`WorktreeManager.discard`).

A worktree persists across the lane's turns: a branch or an uncommitted change in
it is the conversation's own earlier work, so later turns reuse it as it is. Each
is made on the lane's own branch, ``prohost/<lane folder>``, so the work has a
name in the original repository (``git log prohost/conv-…``, merge it, push it):
the branch is made from the source's ``HEAD`` the first time and checked out
again when a collected worktree of the lane is made anew, so nothing committed
is lost (:mod:`prohost.engine.repos.startpoint`; a repository with no commit yet
gets the branch unborn). The lane folder goes into ``PROHOST_RUN_REPOS`` for the
agent, and the agent starts in the first listed checkout's worktree (§5.3).

Preparing never raises for a repository that cannot be prepared: the run goes on,
and the prompt names that checkout as read-only
(a :class:`CheckoutFailure`).

Running git is :mod:`prohost.engine.repos.gitcmd`'s job; clearing away old worktrees is
:mod:`prohost.engine.repos.collect`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal, TypeVar

import attrs
import trio

from prohost.engine.blocking import Bounds, StepTimedOut
from prohost.engine.repos import lanerepo, migrate
from prohost.engine.repos.gitcmd import (
    GIT_ADD_TIMEOUT_S,
    GitError,
    GitPlaces,
    GitTimedOut,
    git,
    git_at,
    real_path,
)
from prohost.engine.repos.gitrecords import (
    adopt_git_dir,
    made_git_dir,
    remove_planted_logs,
    restore_git_files,
)
from prohost.engine.repos.lanemarker import (
    LaneMarker,
    read_marker,
    record_move,
    record_ready,
    touch_marker,
)
from prohost.engine.repos.lanenames import LaneNames
from prohost.engine.repos.lanerepo import (
    lane_repo,
    lane_repo_usable,
    lane_start,
    lay_out,
    object_format,
    restore_alternates,
)
from prohost.engine.repos.startpoint import lane_branch
from prohost.invocation import command
from prohost.repospec import is_checkout

log = logging.getLogger("prohost.worktrees")

T = TypeVar("T")

#: Set in an agent's environment to the folder holding its run's private checkouts.
RUN_REPOS_ENV = "PROHOST_RUN_REPOS"

WORKTREES_DIR = "worktrees"

# --- names -------------------------------------------------------------------------

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_PREFIX_LEN = 32
_LANE_HASH_LEN = 20


def _hash(text: str, length: int) -> str:
    # surrogatepass: a lane id comes from JSON, which can carry a lone surrogate.
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:length]


def lane_folder_name(lane: str) -> str:
    """The harness's own key for ``lane``'s agent folders (its CLI folders and ACP
    agents' folders, never typed by a person; a worktree folder made by an earlier
    version was named so too): a readable prefix and a hash of the whole lane id.

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


def _remove_lane_folder(folder: Path) -> None:
    """Blocking: a lane folder removed whole, following no link (its worktrees'
    git dirs are in its own repositories, inside it)."""
    if folder.is_symlink():
        folder.unlink()
    elif folder.exists():
        shutil.rmtree(folder)


# --- preparing ---------------------------------------------------------------------


@attrs.frozen
class Checkout:
    """A git worktree private to this run's conversation, and the checkout it stands in for."""

    name: str
    path: str
    source: str
    #: The branch the worktree is on as the agent gets it: the lane's,
    #: ``prohost/<lane folder>``, unless the agent switched in an earlier turn;
    #: ``None``: a detached HEAD.
    branch: str | None = None
    #: The worktree was just made and ``branch`` is unborn: the original has no
    #: commit yet, and the agent's first commit creates the branch.
    unborn: bool = False
    #: The original has submodules, which are empty folders in the private worktree.
    has_submodules: bool = False
    #: Its git dir, common dir and work tree, from the harness's records: what every
    #: later git on it and the run's rules use (§13). ``None`` only in tests.
    git: GitPlaces | None = None


@attrs.frozen
class CheckoutFailure:
    """A ``--repos`` checkout no private worktree could be made of, and why."""

    source: str
    reason: str
    #: The run must not go on without it: its worktree, made by an earlier
    #: version, could not be moved to the conversation's own repository (the
    #: next run tries again).
    retryable: bool = False


@attrs.frozen
class PreparedCheckouts:
    """What :meth:`WorktreeManager.prepare` made of one lane's checkouts."""

    folder: Path | None
    """The lane's folder when at least one checkout is ready (for ``PROHOST_RUN_REPOS``)."""
    checkouts: tuple[Checkout, ...]
    failures: tuple[CheckoutFailure, ...]
    first: Checkout | None = None
    """The worktree of the first listed checkout, where the agent starts (§5.3);
    ``None`` when that one could not be prepared."""


State = Literal["ready", "absent", "half-made", "empty", "broken", "foreign", "junk"]


class WorktreeManager:
    """Gives each lane its own worktree of every ``--repos`` checkout.

    One per harness. Runs of one lane never overlap (the scheduler sees to that),
    so only one task at a time touches a given lane folder; different lanes share
    the source repositories, whose worktree bookkeeping (``.git/worktrees``) is only
    changed under a per-source lock.
    """

    def __init__(
        self, home: Path, repos: Sequence[Path], *, bounds: Bounds | None = None,
    ) -> None:
        self.root = home / WORKTREES_DIR
        #: The harness's bounds: a hung disk fails a checkout (a CheckoutFailure,
        #: StepTimedOut being an OSError) instead of holding the run, and the
        #: second signal hurries it.
        self.bounds = bounds if bounds is not None else Bounds()
        self.repos = tuple(repos)
        self.names = checkout_names(self.repos)
        #: Which lane folder is which lane's (the record, and the markers).
        self.lane_names = LaneNames(self.root, lambda folder: read_marker(folder).lane)
        self._locks: dict[str, trio.Lock] = {}
        # A checkout's common dir only changes if it is re-cloned; asking once per
        # source keeps a reused worktree at two git processes per turn (what it
        # is, which branch it is on).
        self._common_dirs: dict[Path, str] = {}
        # Held while a marker is read and written back: one lane's checkouts are
        # prepared at once, and a move records itself as it happens.
        self._marker_lock = trio.Lock()

    @property
    def enabled(self) -> bool:
        return bool(self.repos)

    def source_lock(self, source: Path) -> trio.Lock:
        """The lock held while worktrees of ``source`` are created, repaired or removed."""
        return self._locks.setdefault(str(source), trio.Lock())

    def lane_folder(self, lane: str) -> Path:
        """``lane``'s folder, named (and the name recorded) now if it had none.
        Blocking; raises :class:`OSError` when the record cannot be written."""
        return self.root / self.lane_names.name_for(lane)

    async def _file(self, fn: Callable[..., T], *args: object) -> T:
        """A file step of preparing a checkout, bounded. Abandoning one is safe: each
        touches only this lane's folder (which only this lane's run uses; the marker
        is replaced atomically) or reads, and what a step abandoned half-way leaves
        is what a killed prepare leaves, which the next prepare clears."""
        name = getattr(fn, "__name__", "a file step")
        return await self.bounds.file_step(fn, *args,
                                           what=f"preparing a worktree ({name})")

    async def prepare(self, lane: str,
                      confine: lanerepo.Confine | None = None) -> PreparedCheckouts:
        """Make sure ``lane`` has a worktree of each repo; say which are ready and why
        the others are not. Never raises for a repository; all repos are prepared at once.

        A lane whose worktree must be made while another lane's of the same repo is
        being made waits its turn, however long that takes (each git command is
        bounded): giving up would hand the agent a read-only checkout. The caller
        bounds the whole preparation by the run's deadline
        (:func:`prohost.engine.run.execute.execute`).

        Cancelled: git processes in flight are killed (their whole process group),
        per-source locks are released, and what a half-made worktree leaves behind
        is cleared by the lane's next prepare (it was never handed to an agent).

        ``confine``: how the harness's git reads what a run of a worktree made by
        an earlier version wrote, while moving it (:meth:`_move`).
        """
        # Said if even its name cannot be recorded: the file that could not be written.
        folder = self.lane_names.record
        try:
            folder = await self._file(self.lane_folder, lane)
            # First, so a GC deciding at this moment sees the lane as just used.
            marker = await self._file(touch_marker, folder, lane, time.time())
        except OSError as exc:
            reason = f"could not create {folder}: {exc.strerror or exc}"
            failures = tuple(CheckoutFailure(str(source), reason) for source in self.repos)
            return PreparedCheckouts(folder=None, checkouts=(), failures=failures)

        await self._forget_moved(folder, marker)
        results: list[Checkout | CheckoutFailure | None] = [None] * len(self.repos)

        git_dirs = dict(marker.git_dirs or {})

        async def one(index: int) -> None:
            results[index] = await self._prepare_one(
                folder, self.repos[index], self.names[index], marker.ready, git_dirs, confine
            )

        async with trio.open_nursery() as nursery:
            for index in range(len(self.repos)):
                nursery.start_soon(one, index)
        checkouts = tuple(r for r in results if isinstance(r, Checkout))
        failures = tuple(r for r in results if isinstance(r, CheckoutFailure))
        ready = dict(marker.ready or {})
        ready.update((checkout.name, checkout.source) for checkout in checkouts)
        git_dirs.update((c.name, c.git.git_dir) for c in checkouts if c.git is not None)
        if ready != marker.ready or git_dirs != (marker.git_dirs or {}):
            try:
                # Only now: a worktree is "ready" once it is about to be handed over.
                async with self._marker_lock:
                    await self._file(
                        record_ready, folder, {c.name: c.source for c in checkouts},
                        {c.name: c.git.git_dir for c in checkouts if c.git is not None})
            except OSError as exc:
                log.warning("could not record the checkouts of %s: %s", lane, exc)
        first = results[0] if results and isinstance(results[0], Checkout) else None
        return PreparedCheckouts(
            folder=folder if checkouts else None, checkouts=checkouts, failures=failures,
            first=first,
        )

    async def _prepare_one(
        self, folder: Path, source: Path, name: str, ready: Mapping[str, str] | None,
        git_dirs: dict[str, str], confine: lanerepo.Confine | None = None,
    ) -> Checkout | CheckoutFailure:
        try:
            if not await self._file(source.is_dir):
                return CheckoutFailure(str(source), "no such directory")
            if not await self._file(is_checkout, source):
                return CheckoutFailure(str(source), "not a git checkout")
            common = await self._common_dir(source)
            path = folder / name
            state, git_dir = await self._inspect(
                path, common, git_dirs.get(name),
                (ready or {}).get(name, str(source)) == str(source))
            if state == "foreign" and name != _hashed_name(source):
                # The folder holds a worktree of another repository that used to
                # have this name (--repos changed). It may hold that conversation's
                # work, so it is left alone and this repo takes its hashed name.
                name = _hashed_name(source)
                path = folder / name
                state, git_dir = await self._inspect(
                    path, common, git_dirs.get(name),
                    (ready or {}).get(name, str(source)) == str(source))
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
            unborn = False
            branch: str | None = lane_branch(folder.name)
            if state != "ready" or git_dir is None:
                unborn, places = await self._create(source, path, state, common)
            else:
                # The record's repository: the lane's own, or (a worktree made by
                # an earlier version) the person's, whose worktree is moved into
                # the lane's own before anything else looks at it.
                places = GitPlaces(str(path), git_dir, os.path.dirname(os.path.dirname(git_dir)))
                if migrate.is_legacy(places, common):
                    places = await self._move(folder, source, places, common, confine)
                # What a run rewrote of the files that tie the worktree to its git
                # dir is put back before any git looks at it (§13): never followed.
                restored = await self._file(restore_git_files, places)
                if restored:
                    log.warning("put back %s of the worktree %s, which its run had "
                                "changed", ", ".join(restored), path)
                branch = await self._branch_of(places, lane_branch(folder.name))
            if places.common_dir != common:
                # The lane's own repository: borrowing the person's objects only,
                # with the person's branches as they are now.
                if await self._file(restore_alternates, Path(places.common_dir), common):
                    log.warning("put back the alternates of %s, which a run had changed",
                                places.common_dir)
                try:
                    await lanerepo.sync_refs(Path(places.common_dir), common)
                except GitTimedOut:
                    raise
                except GitError as exc:
                    log.warning("could not give %s the branches of %s: %s", path, source, exc)
            # git leaves a worktree's submodules empty, and git's own documentation
            # advises against checking them out in a linked worktree: the agent is told.
            submodules = await self._file(os.path.lexists, path / ".gitmodules")
            return Checkout(name=name, path=str(path), source=str(source),
                            branch=branch, unborn=unborn,
                            has_submodules=submodules, git=places)
        except migrate.MoveFailed as exc:
            return CheckoutFailure(str(source), str(exc), retryable=True)
        except GitError as exc:
            return CheckoutFailure(str(source), str(exc))
        except OSError as exc:
            return CheckoutFailure(str(source), f"{exc.strerror or exc}")

    async def _move(self, folder: Path, source: Path, old: GitPlaces, common: str,
                    confine: lanerepo.Confine | None = None) -> GitPlaces:
        """Move the worktree at ``old`` (of the person's repository, made by an
        earlier version) into the lane's own repository, its files as they are
        (:mod:`prohost.engine.repos.migrate`); its new places. Raises
        :class:`~prohost.engine.repos.migrate.MoveFailed` saying why: before the
        move is recorded, the old worktree is as it was.

        Cancelled: git is killed; what is left, the next prepare moves again
        (not yet recorded) or finishes (recorded)."""
        path = Path(old.work_tree)
        repo = lane_repo(folder, path.name)
        own = lane_branch(folder.name)
        try:
            head, branch = await self._file(migrate.read_head, Path(old.git_dir), own)
            await self._file(migrate.lay_out_repo, repo, common,
                             await object_format(str(source)))
            await migrate.fetch_branches(repo, common, [own, *([branch] if branch else [])])
            places = await self._file(migrate.write_git_dir, repo, Path(old.git_dir), head,
                                      path)
            kept = await migrate.own_objects(repo, places, common, confine)
            async with self._marker_lock:
                # The move is done once recorded: from here on, the record names
                # the lane's repository, and a prepare finishes what is left.
                await self._file(record_move, folder, path.name, places.git_dir,
                                 old.git_dir)
            await self._file(migrate.point, places)
        except (GitError, OSError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise migrate.MoveFailed(
                f"its checkout, made by an earlier version, could not be moved to a "
                f"repository of the conversation's own ({reason}); nothing of it was lost, "
                "and the next run tries again") from None
        await self._forget(folder, source, places, old.git_dir, common)
        log.info("moved the conversation's checkout %s to a repository of its own "
                 "(%s; made by an earlier version, it shared %s's objects and branches "
                 "with its runs): its files, staged and untracked work are as they were%s",
                 path, repo, source, f", {kept} objects only it kept copied" if kept else "")
        return places

    async def _forget(self, folder: Path, source: Path, places: GitPlaces,
                      old_git_dir: str, common: str) -> None:
        """The git dir ``old_git_dir`` of a moved worktree removed from the person's
        repository, and from the marker's ``moved``; a failure is logged (the next
        prepare tries again). Cancelled: the removal may go on in its thread."""
        try:
            async with self.source_lock(source):
                await self._file(migrate.forget, old_git_dir, common)
            async with self._marker_lock:
                await self._file(record_move, folder, Path(places.work_tree).name,
                                 places.git_dir, None)
        except OSError as exc:
            log.warning("could not remove %s, the git dir of a moved worktree, from %s "
                        "(%s); the next run tries again", old_git_dir, source, exc)

    async def _forget_moved(self, folder: Path, marker: LaneMarker) -> None:
        """What a move interrupted after it was recorded left in the person's
        repository removed (:meth:`_forget`)."""
        for name, old_git_dir in (marker.moved or {}).items():
            source = (marker.ready or {}).get(name)
            if source is None:
                continue
            try:
                common = await self._common_dir(Path(source))
            except GitError as exc:
                log.warning("could not find the repository %s (%s); a moved worktree's "
                            "git dir stays in it", source, exc)
                continue
            recorded = (marker.git_dirs or {}).get(name)
            if recorded is None:
                continue
            places = GitPlaces(str(folder / name), recorded,
                               os.path.dirname(os.path.dirname(recorded)))
            await self._forget(folder, Path(source), places, old_git_dir, common)

    async def bring_back(self, prepared: PreparedCheckouts,
                         confine: lanerepo.Confine | None = None,
                         scratch_root: Path | None = None) -> None:
        """After a run: the person's branch ``prohost/<lane folder>`` of each checkout
        made to what the lane's repository holds (:func:`lanerepo.bring_back`;
        what reads the lane's repository runs through ``confine`` when given, its
        bundle in a folder under ``scratch_root``).
        Never raises: a branch that cannot be brought back is logged, and stays
        in the lane's repository for the next run's end.

        Cancelled: the fetch in flight is killed; each ref is updated whole or not."""
        if prepared.folder is None:
            return
        branch = lane_branch(prepared.folder.name)
        for checkout in prepared.checkouts:
            source = Path(checkout.source)
            if checkout.git is None:
                continue
            try:
                person = await self._common_dir(source)
                if checkout.git.common_dir == person:
                    continue  # made by an earlier version: its branch is the person's
                async with self.source_lock(source):
                    await lanerepo.bring_back(Path(checkout.git.common_dir), person, branch,
                                              confine, scratch_root)
            except (GitError, OSError) as exc:
                log.warning("could not bring the branch %s back to %s: %s", branch,
                            source, exc)

    async def discard(self, lane: str, prepared: PreparedCheckouts) -> bool:
        """Remove ``lane``'s folder (its worktrees, its own repositories) and forget
        its name, for a run without a conversation that left nothing to keep: no
        commit, no changed file (the caller judged its §7 ``changes``). Its branch
        was never brought back to the person's repository. Whether it is gone; a
        failure is logged (``agent gc`` collects the folder later, as it was).

        Cancelled: the removal, shielded and bounded, finishes or is abandoned to
        its thread; what it leaves, collection clears."""
        folder = prepared.folder
        if folder is None:
            return False
        try:
            for checkout in prepared.checkouts:
                if checkout.git is None or checkout.git.common_dir == await self._common_dir(
                        Path(checkout.source)):
                    return False  # made by an earlier version, in the person's repository
        except GitError:
            return False
        try:
            with trio.CancelScope(shield=True):
                await self._file(_remove_lane_folder, folder)
                await self._file(self.lane_names.forget, lane)
        except OSError as exc:
            log.warning("could not remove %s, the worktrees of a run that changed nothing "
                        "(%s); `%s` collects them", folder, exc, command("agent", "gc"))
            return False
        log.info("removed %s: the run changed nothing in it", folder)
        return True

    async def _branch_of(self, places: GitPlaces, own: str) -> str | None:
        """The branch the reused worktree at ``path`` is on (``None``: a detached
        HEAD), for the prompt to say truly. A detached worktree whose lane has no
        branch yet (made by a version that detached them) is put on it first: the
        same commit and files, now with a name in the original repository."""
        path = places.work_tree
        out = await git_at(places, "symbolic-ref", "--quiet", "--short", "HEAD",
                           ok_codes=(0, 1))
        if out.strip():
            return out.strip()
        try:
            # Never moved when the branch exists: the agent detached on purpose.
            await git_at(places, "rev-parse", "--verify", "--quiet", f"refs/heads/{own}")
            return None
        except GitTimedOut:
            raise
        except GitError:
            pass
        try:
            # The branch made at HEAD, then HEAD put on it: the index and the files
            # stay as they are, and no work-tree file is read (a checkout would).
            # The reflogs git appends to are in places the run could write: one
            # it made a link (to a file of the person's) is removed first.
            await self._file(remove_planted_logs, places, own)
            await git_at(places, "update-ref", f"refs/heads/{own}", "HEAD", "")
            await git_at(places, "symbolic-ref", "HEAD", f"refs/heads/{own}")
        except GitTimedOut:
            raise
        except GitError as exc:
            # Still a usable worktree: it stays detached, as before.
            log.warning("could not put %s on the branch %s: %s", path, own, exc)
            return None
        log.info("put the worktree %s on the branch %s", path, own)
        return own

    async def _common_dir(self, source: Path) -> str:
        cached = self._common_dirs.get(source)
        if cached is not None:
            return cached
        out = await git("-C", str(source), "rev-parse", "--git-common-dir")
        # Relative to `source` on gits before 2.31's --path-format; joining copes with both.
        common = real_path(source / out.strip())
        self._common_dirs[source] = common
        return common

    async def _inspect(self, path: Path, common: str, recorded: str | None,
                       same_source: bool = True) -> tuple[State, str | None]:
        """What is at ``path``: a usable worktree of the repo whose common dir is
        ``common``, nothing, or one of the ways a worktree can be unusable; and its
        git dir. Decided from the harness's record (``recorded``, the lane marker's)
        and real paths: no git runs on it, and its ``.git`` file is never followed
        (a run could have rewritten it). A worktree with no record (made by an
        earlier version) is adopted only when its ``.git`` names a git dir of
        ``common`` whose ``gitdir`` names it back. A recorded one is of this
        repository when its git dir is ``common``'s (made by an earlier version)
        or the lane's own repository's (:mod:`prohost.engine.repos.lanerepo`) when
        the marker says that was made for this source (``same_source``)."""
        if not await self._file(os.path.lexists, path):
            return "absent", None
        if await self._file(os.path.islink, path) or not await self._file(path.is_dir):
            return "broken", None
        git_dir = recorded
        if git_dir is None:
            if not await self._file(os.path.lexists, path / ".git"):
                # A `git worktree add` killed before it wrote anything leaves this.
                empty = not await self._file(lambda: any(path.iterdir()))
                return ("empty" if empty else "broken"), None
            adopted, foreign = await self._file(adopt_git_dir, path, common)
            if foreign:
                return "foreign", None
            if adopted is None:
                return "broken", None
            git_dir = adopted
        elif os.path.dirname(os.path.dirname(git_dir)) != common and (
                os.path.dirname(os.path.dirname(git_dir))
                != real_path(lane_repo(path.parent, path.name)) or not same_source):
            return "foreign", None
        if not await self._file(os.path.isdir, git_dir) or await self._file(
                os.path.islink, git_dir):
            return "broken", None  # the bookkeeping it names no longer exists
        # git writes this lock first and removes it last; a worktree still holding
        # it was killed mid-checkout and has a partial tree (LC_ALL=C: see git_env).
        lock_file = Path(git_dir) / "locked"
        try:
            reason = await self._file(lock_file.read_text)
        except StepTimedOut:
            raise  # a hung disk, not a missing lock: this checkout fails
        except OSError:
            return "ready", git_dir
        return ("half-made" if reason.strip() == "initializing" else "ready"), git_dir

    async def _create(self, source: Path, path: Path, state: State,
                      common: str) -> tuple[bool, GitPlaces]:
        """Make the worktree at ``path`` on the lane's branch, clearing what
        ``state`` says is in the way. Returns whether that branch is unborn
        (``source`` has no commit yet), and the places of the worktree made, read
        from its ``.git`` file just after git wrote it (before any run has it)."""
        log.debug("making the worktree %s of %s (found: %s)", path, source, state)
        if state == "empty":
            await self._file(path.rmdir)
        elif state == "broken":
            # Not a worktree any more, but it was handed to an agent and may hold
            # its files: moved aside, not deleted. GC treats it like a dirty worktree.
            aside = path.with_name(f"{path.name}.orphaned-{int(time.time())}")
            await self._file(path.rename, aside)
            log.warning("%s was not a usable git worktree; moved it to %s", path, aside)
        src = str(source)
        if state in ("half-made", "junk"):
            # Waited for without a limit of its own: the holder's git commands are
            # each bounded, and the run's deadline bounds this wait (the caller's
            # scope). (Only a worktree of the person's repository, made by an
            # earlier version, is registered there; one of the lane's repository
            # is forgotten by its prune below.)
            async with self.source_lock(source):
                if await self._file(os.path.lexists, path / ".git"):
                    # Twice --force: git's "initializing" lock is a lock too.
                    with contextlib.suppress(GitError):
                        await git("-C", src, "worktree", "remove", "--force", "--force",
                                  str(path))
            if await self._file(os.path.lexists, path):
                await self._file(shutil.rmtree, path)
        repo = lane_repo(path.parent, path.name)
        if not await self._file(lane_repo_usable, repo):
            await self._file(lay_out, repo, common, await object_format(src))
        else:
            await self._file(restore_alternates, repo, common)
        lane = ("--git-dir", str(repo))
        # A reused lane repository's branch reflog is one its runs could write:
        # one made a link is removed before git appends to it.
        await self._file(remove_planted_logs, GitPlaces(str(path), "", real_path(repo)),
                         lane_branch(path.parent.name))
        start = await lane_start(repo, src, lane_branch(path.parent.name))
        try:
            await git(*lane, "worktree", "add", *start.add_args(str(path)),
                      timeout_s=GIT_ADD_TIMEOUT_S)
        except GitTimedOut:
            raise
        except GitError:
            # Most likely a registration whose folder vanished ("missing but
            # already registered", or the lane's branch still "checked out" in
            # it): the lane's own repository, so its prune forgets nothing of
            # the person's.
            await git(*lane, "worktree", "prune")
            try:
                await git(*lane, "worktree", "add", *start.add_args(str(path)),
                          timeout_s=GIT_ADD_TIMEOUT_S)
            except GitTimedOut:
                raise
            except GitError as exc:
                raise GitError(f"could not check out its branch {start.branch}: "
                               f"{exc}") from None
        places = await self._file(made_git_dir, path, real_path(repo))
        if start.how == "unborn":
            # The worktree is on an unborn branch of its own: the agent's first
            # commit creates it, as in a fresh `git init`. (Cancelled just before
            # this, the worktree stays detached at the empty stand-in commit:
            # still a place to work, and its commits show as "on no branch",
            # which collection keeps.)
            await git_at(places, "symbolic-ref", "HEAD", f"refs/heads/{start.branch}")
        return start.how == "unborn", places
