"""What a run changed in each checkout of its lane (PROTOCOL.md §7, ``changes``; the
entries' shape is :mod:`prohost.wire.changes`).

When a run begins, each lane worktree's state is taken: its commit, and a tree of
its working files (tracked, modified and untracked; ignored files are not work)
written through a temporary index (``GIT_INDEX_FILE``) and ``git write-tree``. That
touches nothing the agent sees: the worktree's own index, files and refs stay as
they were; only objects are added to the store, where git's own gc treats them like
any other loose object. When the run ends the same is taken again, and the two trees
are compared: what an earlier turn left uncommitted is in both, so it is not listed
again; what this run changed is, committed or not.

Each checkout is bounded (:data:`CHANGES_LIMIT_S` for the start, the same for the
end), and a checkout that cannot be read gets an ``error`` entry instead: the report
never waits longer than that, and never fails for it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Awaitable, Mapping, Sequence
from pathlib import Path

import attrs
import trio

from prohost.engine.blocking import Bounds
from prohost.engine.repos.gitcmd import GitError, git, git_env
from prohost.wire.changes import (
    ChangeEntry,
    ChangeKind,
    CheckoutChanges,
    FileChange,
    UnreadableCheckout,
)

#: How long taking one checkout's state may last, at the start and at the end (s).
CHANGES_LIMIT_S = 5.0
#: At most this many files per checkout; ``more_files`` counts the rest.
MAX_FILES = 100
#: git's empty tree: the "before" of a repository with no commit yet.
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"

_CHANGE_KINDS: dict[str, ChangeKind] = {"A": "added", "M": "modified", "D": "deleted",
                                         "R": "renamed", "T": "modified", "C": "added"}


@attrs.frozen
class CheckoutState:
    """One checkout as it was at a moment: its commit (``None`` before the first
    one) and the tree of its working files; or why it could not be read."""

    #: The folder name the report shows (never a local path).
    repo: str
    path: Path
    commit: str | None = None
    tree: str | None = None
    error: str | None = None


async def take_state(repo: str, path: Path, *, bounds: Bounds,
                     limit_s: float = CHANGES_LIMIT_S,
                     env: Mapping[str, str] | None = None) -> CheckoutState:
    """The state of the worktree at ``path`` now, within ``limit_s``; a state with
    ``error`` set when it cannot be read (not a checkout, git failing, too slow).
    Its two small file steps (a private copy of the index, removed after) go
    through ``bounds``, the harness's.

    Cancelled: the git command running is killed with its group (as
    :func:`prohost.engine.repos.gitcmd.git`), the private copy is removed (shielded,
    bounded); nothing in the worktree has changed.
    """
    with trio.move_on_after(limit_s) as scope:
        try:
            return await _state(repo, path, env, bounds, trio.current_time() + limit_s)
        except (GitError, OSError) as exc:
            return CheckoutState(repo, path, error=_said(exc))
    assert scope.cancelled_caught
    return CheckoutState(repo, path, error=f"reading the checkout took longer than "
                                           f"{limit_s:g} s")


async def _state(repo: str, path: Path, env: Mapping[str, str] | None, bounds: Bounds,
                 deadline: float) -> CheckoutState:
    where = os.fspath(path)
    base_env = git_env(env)
    # First: this fails plainly ("not a git repository") where nothing else would.
    index = (await git("-C", where, "rev-parse", "--path-format=absolute",
                       "--git-path", "index", env=base_env)).strip()
    head = await _optional(git("-C", where, "rev-parse", "--verify", "-q", "HEAD^{commit}",
                               env=base_env))  # None: no commit yet
    # Start from a copy of the worktree's own index (read, never written) so that
    # git's stat cache spares it hashing every unchanged file again.
    folder = await bounds.file_step(_private_index, index, what="copying a git index",
                                    limit_s=max(0.0, deadline - trio.current_time()))
    try:
        private = {**base_env, "GIT_INDEX_FILE": os.path.join(folder, "index")}
        await git("-C", where, "add", "-A", ".", env=private)
        tree = (await git("-C", where, "write-tree", env=private)).strip()
    finally:
        # Shielded by Bounds, and bounded: a leftover in the temporary folder is
        # the worst a hung disk makes of it.
        await bounds.file_step(shutil.rmtree, folder, True, what="removing a git index copy",
                               limit_s=1.0)
    return CheckoutState(repo, path, commit=head, tree=tree)


def _private_index(index: str) -> str:
    """Blocking: a new private folder holding a copy of ``index`` as ``index`` (none
    when the worktree has none yet: git then starts from an empty one)."""
    folder = tempfile.mkdtemp(prefix="prohost-changes-")
    try:
        shutil.copyfile(index, os.path.join(folder, "index"))
    except FileNotFoundError:
        pass
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def _said(exc: Exception) -> str:
    """One line for a checkout that could not be read."""
    if isinstance(exc, GitError):
        return str(exc)
    return f"could not read the checkout: {getattr(exc, 'strerror', None) or exc}"


async def compare(before: CheckoutState, *, bounds: Bounds,
                  limit_s: float = CHANGES_LIMIT_S,
                  env: Mapping[str, str] | None = None) -> ChangeEntry:
    """The §7 ``changes`` entry for one checkout: what changed since ``before``,
    taking its state again now, within ``limit_s``.

    Cancelled: as :func:`take_state`.
    """
    if before.error is not None:
        return UnreadableCheckout(before.repo, before.error)
    with trio.move_on_after(limit_s) as scope:
        try:
            after = await _state(before.repo, before.path, env, bounds,
                                 trio.current_time() + limit_s)
            return await _entry(before, after, git_env(env))
        except (GitError, OSError) as exc:
            return UnreadableCheckout(before.repo, _said(exc))
    assert scope.cancelled_caught
    return UnreadableCheckout(before.repo,
                              f"reading the checkout took longer than {limit_s:g} s")


async def _entry(before: CheckoutState, after: CheckoutState,
                 env: Mapping[str, str]) -> CheckoutChanges:
    where = os.fspath(after.path)
    assert before.tree is not None and after.tree is not None
    branch = await _optional(git("-C", where, "symbolic-ref", "--short", "-q", "HEAD",
                                 env=env))  # None: detached
    head = after.commit
    if head is None:
        commits = 0
    elif before.commit is None:
        commits = int(await git("-C", where, "rev-list", "--count", head, env=env))
    else:
        commits = int(await git("-C", where, "rev-list", "--count",
                                f"{before.commit}..{head}", env=env))
    kinds = _name_status(await git("-C", where, "diff-tree", "-r", "-M", "-z",
                                   "--name-status", before.tree, after.tree, env=env))
    counts = _numstat(await git("-C", where, "diff-tree", "-r", "-M", "-z", "--numstat",
                                before.tree, after.tree, env=env))
    head_tree = f"{head}^{{tree}}" if head is not None else EMPTY_TREE
    uncommitted = set(_paths(await git("-C", where, "diff-tree", "-r", "-z", "--name-only",
                                       head_tree, after.tree, env=env)))
    files = []
    for path in sorted(kinds):
        change, old = kinds[path]
        added, removed = counts.get(path, (None, None))
        committed = path not in uncommitted and (old is None or old not in uncommitted)
        files.append(FileChange(path=path, change=change, added=added, removed=removed,
                                committed=committed, from_=old))
    return CheckoutChanges(repo=after.repo, branch=branch, base=before.commit, head=head,
                           commits=commits, files=files[:MAX_FILES],
                           more_files=max(0, len(files) - MAX_FILES))


async def _optional(command: Awaitable[str]) -> str | None:
    """A git question whose "no" is its exit status 1 (no HEAD yet, detached):
    its one-line answer, or ``None``."""
    try:
        return (await command).strip() or None
    except GitError:
        return None


async def states_of(checkouts: Sequence[tuple[str, Path]], *, bounds: Bounds,
                    env: Mapping[str, str] | None = None) -> list[CheckoutState]:
    """Each ``(name, worktree)``'s state as the run begins, one after another (each
    bounded by :data:`CHANGES_LIMIT_S`). Cancelled: as :func:`take_state`."""
    return [await take_state(name, path, bounds=bounds, env=env) for name, path in checkouts]


async def changes_of(states: Sequence[CheckoutState], unready: Sequence[tuple[str, str]], *,
                     bounds: Bounds, env: Mapping[str, str] | None = None,
                     ) -> list[ChangeEntry]:
    """The §7 ``changes``: each state compared now (bounded per checkout), then an
    ``error`` entry for each ``(name, why)`` checkout no worktree could be made of;
    the caller orders them as ``--repos`` does. Cancelled: as :func:`compare`."""
    found = [await compare(state, bounds=bounds, env=env) for state in states]
    return found + [UnreadableCheckout(name, f"no private worktree: {why}")
                    for name, why in unready]


def _name_status(text: str) -> dict[str, tuple[ChangeKind, str | None]]:
    """``--name-status -z``: status, then one path (two for a rename or copy)."""
    fields = text.split("\0")
    found: dict[str, tuple[ChangeKind, str | None]] = {}
    i = 0
    while i < len(fields) and fields[i]:
        status = fields[i]
        kind = _CHANGE_KINDS.get(status[:1], "modified")
        if status[:1] in ("R", "C"):
            old, new = fields[i + 1], fields[i + 2]
            found[new] = (kind, old if status[:1] == "R" else None)
            i += 3
        else:
            found[fields[i + 1]] = (kind, None)
            i += 2
    return found


def _numstat(text: str) -> dict[str, tuple[int | None, int | None]]:
    """``--numstat -z``: ``added<TAB>removed<TAB>path`` or, for a rename,
    ``added<TAB>removed<TAB>`` then the old and new paths; ``-`` for binary files."""
    fields = text.split("\0")
    found: dict[str, tuple[int | None, int | None]] = {}
    i = 0
    while i < len(fields) and fields[i]:
        added, removed, path = fields[i].split("\t", 2)
        if path:
            i += 1
        else:  # a rename: the two paths follow
            path = fields[i + 2]
            i += 3
        found[path] = (None if added == "-" else int(added),
                       None if removed == "-" else int(removed))
    return found


def _paths(text: str) -> list[str]:
    return [path for path in text.split("\0") if path]
