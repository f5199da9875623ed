"""What a run changed in each checkout of its lane (docs/protocol.md §7, ``changes``; the
entries' shape is :mod:`prohost.wire.changes`).

When a run begins, each lane worktree's state is taken without writing anything
(no object, no index, no ref): its commit, and what ``git status`` (with
``--no-optional-locks``, so the worktree's own index is never refreshed; its
racy-clean check is git's own, on the real index) lists as differing from that
commit, each such path with its content's blob id hashed here from the working file
(git's own hashing of ``blob <size>\\0<bytes>``, never written to the store) and,
for small ones, its bytes kept in memory for the line counts. When the run ends the
same is taken again, with the commits' difference (``diff-tree --raw``): a path
whose content is the same at both ends is not listed, so what an earlier turn left
uncommitted is not listed again; what this run changed is, committed or not.
Renames are exact ones (a deleted path's content added under another). An untracked
file at the end is read only where its content could matter (it had a value at the
start or in the base commit, or some path is gone and it may be that one renamed).
Line counts are for the listed files only: a file added or deleted whole is counted
here as git counts it; the others by one ``git diff --no-index`` of the two contents
copied into a private temporary folder (outside the repository).

Each checkout is bounded (:data:`CHANGES_LIMIT_S` for the start, the same for the
end). A checkout that cannot be read at all gets an ``error`` entry; one too slow to
list keeps ``branch``, ``base``, ``head`` and ``commits`` and says why its files are
cut short (``truncated``). No text names a local path (:func:`without_paths`).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import attrs
import trio

from prohost.engine.blocking import Bounds
from prohost.engine.repos.gitcmd import GitError, GitPlaces, git_env
from prohost.engine.repos.gitrecords import planted_worktree_config
from prohost.engine.repos.gitsession import PLAIN_GIT, Git
from prohost.engine.repos.worktreefiles import worktree_file, worktree_stat
from prohost.wire.changes import (
    ChangeEntry,
    ChangeKind,
    CheckoutChanges,
    FileChange,
    UnreadableCheckout,
)
from prohost.wire.outcomes import without_local_paths

#: How long taking one checkout's state may last, at the start and at the end (s).
CHANGES_LIMIT_S = 5.0
#: At most this many files per checkout; ``more_files`` counts the rest.
MAX_FILES = 100
#: git's empty tree: the "before" of a repository with no commit yet.
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
#: A file's bytes are kept at the start (for its line counts at the end) up to this
#: size, and all of a checkout's up to the second.
KEEP_FILE_BYTES = 1 << 20
KEEP_TOTAL_BYTES = 16 << 20
#: Files larger than this are not copied for counting: their counts are ``null``.
COUNT_FILE_BYTES = 32 << 20

_NO_MODE = "000000"
#: A value naming a nested repository (an untracked folder holding its own ``.git``).
_NESTED = "nested repository"
#: The value of an untracked file not read (yet): present, content unknown. It
#: equals no real value, so it only ever says "differs from nothing".
_UNREAD = "100644:unread"
#: Lines added and removed (``None``: binary, or not known).
_Counts = tuple[int | None, int | None]
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")

T = TypeVar("T")


@attrs.frozen
class Seen:
    """One path that ``git status`` listed: its value in the commit (``None`` when
    not there) and in the working tree (``None`` when absent), each ``mode:id``."""

    head: str | None
    work: str | None


@attrs.frozen
class CheckoutState:
    """One checkout as it was at a moment: its commit (``None`` before the first
    one) and the paths differing from it; or why it could not be read."""

    #: The folder name the report shows (never a local path).
    repo: str
    path: Path
    commit: str | None = None
    #: Paths differing from ``commit`` (``None`` when they could not be listed).
    seen: Mapping[str, Seen] | None = None
    #: Some of those paths' bytes (small files), for line counts.
    kept: Mapping[str, bytes] = attrs.field(factory=dict)
    error: str | None = None
    #: Why ``seen`` is missing although the commit is known.
    truncated: str | None = None
    #: Where its git state is, from the harness's records (§13): every git on it
    #: names these, never what its ``.git`` file says. ``None``: found by git.
    git: GitPlaces | None = None
    #: What ``.gitignore`` hid at the start: ignored paths, a folder's with its
    #: trailing ``/`` (git names an ignored folder, not what is in it). A file that
    #: a run's ``.gitignore`` edit uncovers is not one it added (issue 37).
    ignored: frozenset[str] = frozenset()
    #: When the state was taken (epoch s): a file hidden then, uncovered at the
    #: end and not written since, was there before the run.
    taken_at: float = 0.0


def without_paths(text: str, path: Path | str, repo: str,
                  home: Path | str | None = None) -> str:
    """``text`` naming neither the worktree ``path`` (written as the checkout's
    name) nor ``home`` (written as ``$PROHOST_HOME``) nor the user's home (``~``)."""
    places: list[tuple[Path | str, str]] = [(path, repo)]
    if home is not None:
        places.append((home, "$PROHOST_HOME"))
    return without_local_paths(text, places)


@attrs.frozen
class CheckoutReader:
    """How checkouts are read: every step on their files through ``bounds`` (the
    harness's, which its second signal hurries), every git through ``run``
    (confined, where runs are: then a submodule's own changes are read too), with
    git's environment made from ``env``. Made once per reading of a run's checkouts
    (:mod:`prohost.engine.run.checkouts`), so no function below is handed them."""

    bounds: Bounds = attrs.Factory(Bounds)
    env: Mapping[str, str] | None = None
    run: Git = PLAIN_GIT

    async def state(self, repo: str, path: Path, *, limit_s: float = CHANGES_LIMIT_S,
                    places: GitPlaces | None = None) -> CheckoutState:
        """The state of the worktree at ``path`` now (its git state at ``places``),
        within ``limit_s``; a state with ``error`` set when it cannot be read (not a
        checkout, git failing, too slow to give even its commit), with ``truncated``
        when its files could not be listed in time.

        Cancelled: the git command running is killed with its group (as
        :func:`prohost.engine.repos.gitcmd.git`); nothing was written anywhere.
        """
        run = self.run
        look = self._look(path, places, trio.current_time() + limit_s)
        where, base_env, deadline = look.where, look.env, look.deadline
        if await self._planted(places):
            return CheckoutState(repo, path, error=PLANTED_CONFIG, git=places)
        with trio.move_on_at(deadline) as scope:
            try:
                commit = await _commit(where, base_env, run)
            except (GitError, OSError) as exc:
                return CheckoutState(repo, path, error=_said(exc, path, repo), git=places)
        if scope.cancelled_caught:
            return CheckoutState(repo, path, error=f"reading the checkout took longer than "
                                                   f"{limit_s:g} s", git=places)
        taken_at = time.time()
        ignored: set[str] = set()
        with trio.move_on_at(deadline) as scope:
            try:
                seen, kept, _ = await _seen(look, keep=True, ignored=ignored)
            except (GitError, OSError) as exc:
                return CheckoutState(repo, path, commit=commit,
                                     truncated=f"its files could not be read at the start: "
                                               f"{_said(exc, path, repo)}", git=places)
            return CheckoutState(repo, path, commit=commit, seen=seen, kept=kept, git=places,
                                 ignored=frozenset(ignored), taken_at=taken_at)
        return CheckoutState(repo, path, commit=commit,
                             truncated=f"listing its files at the start took longer than "
                                       f"{limit_s:g} s", git=places)

    async def compare(self, before: CheckoutState, *,
                      limit_s: float = CHANGES_LIMIT_S) -> ChangeEntry:
        """The §7 ``changes`` entry for one checkout: what changed since ``before``,
        taking its state again now, within ``limit_s``. Its commits come first; its
        files, as far as the bound lets them (``truncated`` says why they stop short).

        Cancelled: as :meth:`state`.
        """
        if before.error is not None:
            return UnreadableCheckout(before.repo, before.error)
        run = self.run
        look = self._look(before.path, before.git, trio.current_time() + limit_s)
        where, base_env, deadline = look.where, look.env, look.deadline
        if await self._planted(before.git):
            return UnreadableCheckout(before.repo, PLANTED_CONFIG)
        with trio.move_on_at(deadline) as scope:
            try:
                head = await _commit(where, base_env, run)
                header = await _header(where, before.commit, head, base_env, run)
            except (GitError, OSError) as exc:
                return UnreadableCheckout(before.repo, _said(exc, before.path, before.repo))
        if scope.cancelled_caught:
            return UnreadableCheckout(before.repo,
                                      f"reading the checkout took longer than {limit_s:g} s")
        branch, commits = header
        entry = CheckoutChanges(repo=before.repo, branch=branch, base=before.commit,
                                head=head, commits=commits, files=[], more_files=0,
                                truncated=before.truncated)
        if before.seen is None:
            return entry
        with trio.move_on_at(deadline) as scope:
            try:
                return await _files(entry, before, look, limit_s)
            except (GitError, OSError) as exc:
                return attrs.evolve(entry, truncated=f"its files could not be read: "
                                                     f"{_said(exc, before.path, before.repo)}")
        return attrs.evolve(entry,
                            truncated=f"listing its files took longer than {limit_s:g} s")

    async def states(self, checkouts: Sequence[tuple[str, Path]],
                     places: Mapping[str, GitPlaces] | None = None) -> list[CheckoutState]:
        """Each ``(name, worktree)``'s state as the run begins, one after another (each
        bounded by :data:`CHANGES_LIMIT_S`); ``places``: each name's git places, from
        the harness's records. Cancelled: as :meth:`state`."""
        known = places or {}
        return [await self.state(name, path, places=known.get(name))
                for name, path in checkouts]

    async def changes(self, states: Sequence[CheckoutState],
                      unready: Sequence[tuple[str, str]]) -> list[ChangeEntry]:
        """The §7 ``changes``: each state compared now (bounded per checkout), then an
        ``error`` entry for each ``(name, why)`` checkout no worktree could be made of;
        the caller orders them as ``--repos`` does. Cancelled: as :meth:`compare`."""
        found = [await self.compare(state) for state in states]
        return found + [UnreadableCheckout(name, f"no private worktree: {why}")
                        for name, why in unready]

    def _look(self, path: Path, places: GitPlaces | None, deadline: float) -> _Look:
        return _Look(os.fspath(path), _env(self.env, places), deadline, self.bounds,
                     self.run)

    async def _planted(self, places: GitPlaces | None) -> bool:
        """Whether git outside a confinement would read settings a run wrote: a
        ``config.worktree`` in the worktree's git dir (§13; see
        :mod:`prohost.engine.repos.gitrecords`). Inside one, git may read them."""
        if self.run.confined or places is None:
            return False
        try:
            return await self.bounds.file_step(planted_worktree_config, places,
                                               what="looking at a checkout's git dir",
                                               limit_s=1.0)
        except OSError:
            return True  # not known: not read


@attrs.frozen
class _Look:
    """One reading of one checkout: where it is, git's environment for it, when the
    reading must be over (trio time), and the reader's bounds and git."""

    where: str
    env: Mapping[str, str]
    deadline: float
    bounds: Bounds
    run: Git

    async def file_step(self, fn: Callable[..., T], *args: object, what: str) -> T:
        """``fn(*args)`` as a bounded file step, within what is left of the reading."""
        return await self.bounds.file_step(
            fn, *args, what=what, limit_s=max(0.0, self.deadline - trio.current_time()))


#: Why a checkout is not read outside a confinement (see :meth:`CheckoutReader._planted`).
PLANTED_CONFIG = ("its git dir holds a config.worktree that a run wrote, which the harness "
                  "reads only inside a confinement (none here); the next run's start "
                  "removes it")


def _env(env: Mapping[str, str] | None, places: GitPlaces | None) -> dict[str, str]:
    """git's environment for a checkout: naming its places when the harness has
    them, so no git here reads its ``.git`` file (§13)."""
    return places.env(env) if places is not None else git_env(env)


async def _commit(where: str, env: Mapping[str, str], run: Git) -> str | None:
    # First: this fails plainly ("not a git repository") where nothing else would.
    await run("-C", where, "rev-parse", "--git-dir", env=env)
    return await _optional(run("-C", where, "rev-parse", "--verify", "-q", "HEAD^{commit}",
                               env=env))  # None: no commit yet


async def _seen(look: _Look, *, keep: bool, defer_untracked: bool = False,
                ignored: set[str] | None = None,
                ) -> tuple[dict[str, Seen], dict[str, bytes], list[str]]:
    """Every path ``git status`` lists as differing from the commit, with its values
    (see :class:`Seen`), and (``keep``) the bytes of the small ones. With
    ``defer_untracked``, untracked files are not read: their value is
    :data:`_UNREAD` and their names come third, for :func:`_fill` to read the few
    whose content matters. With ``ignored``, the ignored paths are added to it (an
    ignored folder once, with its ``/``)."""
    # Unconfined, submodules' commits, never their files: for their files git
    # would run a `git status` inside each, with the config and attributes
    # (filter programs) of a repository the run may have planted there (§13).
    # Confined, that git has the run's rights only: their files are read.
    where, env, run = look.where, look.env, look.run
    out = await run("--no-optional-locks", "-C", where, "status", "--porcelain=v2", "-z",
                    "--untracked-files=all", "--no-renames",
                    *(() if run.confined else ("--ignore-submodules=dirty",)),
                    *(("--ignored=matching",) if ignored is not None else ()),
                    env=env)
    heads: dict[str, str | None] = {}
    work: dict[str, str | None] = {}
    to_read: list[str] = []
    unread: list[str] = []
    fields = out.split("\0")
    i = 0
    while i < len(fields):
        field = fields[i]
        i += 1
        if not field:
            continue
        kind = field[:1]
        if kind == "!":
            if ignored is not None:
                ignored.add(field[2:])
            continue
        if kind == "?":
            name = field[2:]
            if name.endswith("/"):  # a folder with a .git of its own: one entry
                name = name.rstrip("/")
                heads.setdefault(name, None)
                work[name] = _NESTED
            else:
                heads.setdefault(name, None)
                if defer_untracked:
                    work[name] = _UNREAD
                    unread.append(name)
                else:
                    to_read.append(name)
            continue
        if kind == "1":
            parts = field.split(" ", 8)
            _, _xy, sub, m_head, _m_index, m_work, h_head, h_index, name = parts
        elif kind == "2":  # not asked for (--no-renames), read all the same
            parts = field.split(" ", 9)
            _, _xy, sub, m_head, _m_index, m_work, h_head, h_index, _score, name = parts
            i += 1  # the old path
        elif kind == "u":
            parts = field.split(" ", 10)
            _, _xy, sub, _m1, _m2, _m3, m_work, h_head, _h2, h_index, name = parts
            m_head = "100644"
        else:
            continue
        heads[name] = None if m_head == _NO_MODE else f"{m_head}:{h_head}"
        if m_work == _NO_MODE:
            work[name] = None
        elif sub.startswith("S"):
            commit = h_index
            if sub[1] == "C":
                # The submodule's own repository: its git dir is not the checkout's.
                commit = await _optional(run("-C", os.path.join(where, name), "rev-parse",
                                             "HEAD", env=git_env(env))) or "unknown"
            dirty = "+dirty" if "M" in sub[2:] or "U" in sub[2:] else ""
            work[name] = f"160000:{commit}{dirty}"
        else:
            to_read.append(name)
    read, kept = await look.file_step(_read_all, where, to_read, keep,
                                      what="reading a checkout's changed files")
    work.update(read)
    return {name: Seen(heads.get(name), work.get(name)) for name in work}, kept, unread


def _read_all(where: str, names: list[str], keep: bool,
              ) -> tuple[dict[str, str | None], dict[str, bytes]]:
    """Blocking: each working file's ``mode:blob id`` (``None``: gone), and the bytes
    of the small ones when ``keep``."""
    values: dict[str, str | None] = {}
    kept: dict[str, bytes] = {}
    total = 0
    for name in names:
        data, mode = worktree_file(where, name)
        if data is None:
            values[name] = None if mode is None else f"{mode}:{_NESTED}"
            continue
        values[name] = f"{mode}:{_blob_id(data)}"
        if keep and len(data) <= KEEP_FILE_BYTES and total + len(data) <= KEEP_TOTAL_BYTES:
            kept[name] = data
            total += len(data)
    return values, kept


def _blob_id(data: bytes) -> str:
    """The id git gives these bytes as a blob (nothing is written)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _said(exc: Exception, path: Path | str, repo: str) -> str:
    """One line for a checkout that could not be read, naming no local path."""
    if isinstance(exc, GitError):
        said = str(exc)
    else:
        said = f"could not read the checkout: {getattr(exc, 'strerror', None) or exc}"
    return without_paths(said, path, repo)


async def _header(where: str, base: str | None, head: str | None,
                  env: Mapping[str, str], run: Git) -> tuple[str | None, int]:
    branch = await _optional(run("-C", where, "symbolic-ref", "--short", "-q", "HEAD",
                                 env=env))  # None: detached
    if head is None:
        return branch, 0
    span = head if base is None else f"{base}..{head}"
    return branch, int(await run("-C", where, "rev-list", "--count", span, env=env))


async def _files(entry: CheckoutChanges, before: CheckoutState, look: _Look,
                 limit_s: float) -> CheckoutChanges:
    assert before.seen is not None
    old = before.seen
    where, env, run = look.where, look.env, look.run
    new, _, unread = await _seen(look, keep=False, defer_untracked=True)
    moved: dict[str, tuple[str | None, str | None]] = {}
    if entry.head is not None and entry.head != entry.base:
        moved = _raw(await run("-C", where, "diff-tree", "--no-ext-diff", "--no-textconv",
                               "-r", "-z", "--no-renames",
                               "--raw", entry.base or EMPTY_TREE, entry.head, env=env))

    def was(name: str) -> str | None:
        if name in old:
            return old[name].work
        if name in moved:
            return moved[name][0]
        return new[name].head

    def head_now(name: str) -> str | None:
        if name in new:
            return new[name].head
        if name in moved:
            return moved[name][1]
        return old[name].head

    def now(name: str) -> str | None:
        return new[name].work if name in new else head_now(name)

    def differing() -> dict[str, tuple[str | None, str | None]]:
        pairs = {name: (was(name), now(name)) for name in {*old, *new, *moved}}
        return {name: pair for name, pair in pairs.items() if pair[0] != pair[1]}

    # Untracked at the start, gone from the list now but not from the commits: if
    # the file is still there, a .gitignore now hides it. It is neither deleted nor
    # added (issue 37): its value now is what it holds.
    hidden = [name for name, seen in old.items() if name not in new and name not in moved
              and seen.head is None and seen.work is not None and head_now(name) is None]
    if hidden:
        read, _ = await look.file_step(_read_all, where, hidden, False,
                                       what="reading a checkout's ignored files")
        for name, value in read.items():
            if value is not None:
                new[name] = Seen(None, value)
    # Hidden by a .gitignore at the start and uncovered now: a file not written
    # since the start was there before the run, whatever it holds (its content
    # then was not read): not added.
    if before.ignored:
        uncovered = [name for name in unread if name not in old and name not in moved
                     and _was_ignored(name, before.ignored)]
        if uncovered:
            older = await look.file_step(_unchanged_since, where, uncovered, before.taken_at,
                                         what="reading a checkout's uncovered files")
            for name in older:
                del new[name]
                unread.remove(name)
    changed = differing()
    # An untracked file's content matters only where it may equal something: a value
    # it had at the start or in the base commit (then it may be unchanged), or a path
    # gone (it may be that path renamed). The others are added whatever they hold,
    # and reading thousands of them would be most of the time spent.
    if unread:
        any_gone = any(then is not None and value is None and _is_file(then)
                       for then, value in changed.values())
        needed = unread if any_gone else [name for name in unread
                                          if name in old or name in moved]
        if needed:
            read, _ = await look.file_step(_read_all, where, needed, False,
                                           what="reading a checkout's new files")
            for name, value in read.items():
                new[name] = Seen(new[name].head, value)
            changed = differing()
    # Exact renames: a path gone whose content (a file's) another path gained.
    gone = {pair[0]: name for name, pair in sorted(changed.items())
            if pair[1] is None and pair[0] is not None and _is_file(pair[0])}
    renamed: dict[str, str] = {}
    if gone:
        for name, (then, value) in sorted(changed.items()):
            if then is None and value is not None and value in gone:
                renamed[name] = gone.pop(value)
        for name in renamed.values():
            del changed[name]
    names = sorted(changed)
    listed: list[FileChange] = []
    for name in names[:MAX_FILES]:  # only the listed ones are described
        then, value = changed[name]
        source = renamed.get(name)
        change: ChangeKind = ("renamed" if source is not None else "added" if then is None
                              else "deleted" if value is None else "modified")
        committed = value == head_now(name) and (source is None or head_now(source) is None)
        listed.append(FileChange(path=name, change=change, added=None, removed=None,
                                 committed=committed, from_=source))
    entry = attrs.evolve(entry, files=listed, more_files=len(names) - len(listed))
    with trio.move_on_at(look.deadline) as scope:
        counts = await _counts(listed, changed, before, look)
    if scope.cancelled_caught:
        entry = attrs.evolve(entry, truncated=f"counting its lines took longer than "
                                              f"{limit_s:g} s")
        counts = {}
    return attrs.evolve(entry, files=[
        attrs.evolve(row, path=shown(row.path),
                     from_=None if row.from_ is None else shown(row.from_),
                     added=counts.get(row.path, (None, None))[0],
                     removed=counts.get(row.path, (None, None))[1]) for row in listed])


def shown(name: str) -> str:
    """A path as §7 sends it: U+FFFD for each byte that is not UTF-8 (``os.fsdecode``
    made each such byte a lone surrogate)."""
    return _ESCAPED_BYTE.sub("\ufffd", name) if not name.isascii() else name


def _was_ignored(name: str, ignored: frozenset[str]) -> bool:
    """Whether ``name`` was hidden by an ignore rule (itself, or a folder above it)."""
    if name in ignored:
        return True
    parts = name.split("/")
    return any("/".join(parts[:depth]) + "/" in ignored for depth in range(1, len(parts)))


def _unchanged_since(where: str, names: list[str], since: float) -> list[str]:
    """Blocking: those of ``names`` whose file was last changed before ``since``."""
    older = []
    for name in names:
        info = worktree_stat(where, name)  # following no link, as every read here
        if info is not None and max(info.st_mtime, info.st_ctime) < since:
            older.append(name)
    return older


def _is_file(value: str) -> bool:
    return value.startswith(("100644:", "100755:", "120000:"))


async def _counts(listed: list[FileChange], changed: Mapping[str, tuple[str | None, str | None]],
                  before: CheckoutState, look: _Look,
                  ) -> dict[str, tuple[int | None, int | None]]:
    """Each listed file's lines added and removed (``None`` for binary files, and
    where a side's content is not known: a large file left changed by an earlier
    turn, or one larger than :data:`COUNT_FILE_BYTES`). A file added or deleted
    whole is counted here, as git counts it; the files changed on both sides by one
    ``git diff --no-index`` of the two sides copied aside."""
    where, env, run, bounds = look.where, look.env, look.run, look.bounds
    sides: dict[int, bytes | None] = {}  # the old side (None: absent); the new is read
    for index, row in enumerate(listed):
        then, value = changed[row.path]
        if (then is not None and not _is_file(then)) or (value is not None
                                                          and not _is_file(value)):
            continue  # a submodule or nested repository: no lines
        if row.from_ is not None:
            sides[index] = None  # an exact rename: counted (0, 0) below
            continue
        old: bytes | None = None
        if then is not None:
            if before.seen is not None and row.path in before.seen:
                old = before.kept.get(row.path)
                if old is None:
                    continue  # too large to have been kept
            else:
                old = (await run("-C", where, "cat-file", "blob", then.split(":", 1)[1],
                                 env=env)).encode("utf-8", "surrogateescape")
        sides[index] = old
    if not sides:
        return {}
    counted, both = await look.file_step(_read_sides, where, listed, changed, sides,
                                         what="reading changed files for line counts")
    found = {listed[index].path: counts for index, counts in counted.items()}
    if not both:
        return found
    # Confined, in the session's own folder: the only one of the harness's it sees.
    folder = await bounds.file_step(tempfile.mkdtemp, "", "prohost-changes-", run.scratch,
                                    what="making a folder for line counts", limit_s=1.0)
    try:
        await look.file_step(_lay_out, folder, both,
                             what="copying changed files for line counts")
        out = await _no_index_numstat(folder, env, run)
    finally:
        await bounds.file_step(shutil.rmtree, folder, True,
                               what="removing the line counts' folder", limit_s=1.0)
    for index in both:
        found[listed[index].path] = out.get(index, (0, 0))
    return found


def _read_sides(where: str, listed: list[FileChange],
                changed: Mapping[str, tuple[str | None, str | None]],
                sides: Mapping[int, bytes | None],
                ) -> tuple[dict[int, _Counts], dict[int, tuple[bytes, bytes]]]:
    """Blocking: the counts of the listed files with one side only (added or deleted
    whole, or an exact rename), and the two sides of the others, by index. A file
    too large to count, or gone meanwhile, is in neither."""
    counted: dict[int, _Counts] = {}
    both: dict[int, tuple[bytes, bytes]] = {}
    for index, old in sides.items():
        row = listed[index]
        if row.from_ is not None:
            counted[index] = (0, 0)
            continue
        new = b""
        if changed[row.path][1] is not None:
            data = _small_content(where, row.path)
            if data is None:
                continue
            new = data
        if not old or not new:
            lines_old, lines_new = _lines(old or b""), _lines(new)
            if lines_old is None or lines_new is None:
                counted[index] = (None, None)  # binary, as git says "-"
            else:
                counted[index] = (lines_new, lines_old)
        else:
            both[index] = (old, new)
    return counted, both


def _small_content(where: str, name: str) -> bytes | None:
    """Blocking: as :func:`~prohost.engine.repos.worktreefiles.worktree_file`,
    without reading a file larger than :data:`COUNT_FILE_BYTES` (``None`` then,
    and when it is gone, a folder or cannot be read following no link: its count
    is then ``null``)."""
    data, _ = worktree_file(where, name, limit=COUNT_FILE_BYTES)
    return data if data is not None and len(data) <= COUNT_FILE_BYTES else None


def _lines(data: bytes) -> int | None:
    """The lines git's numstat counts for a file added or deleted whole; ``None``
    for a binary one (a NUL in its first 8,000 bytes: git's own test)."""
    if b"\0" in data[:8000]:
        return None
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def _lay_out(folder: str, both: Mapping[int, tuple[bytes, bytes]]) -> None:
    """Blocking: ``folder/a/<index>`` and ``folder/b/<index>``, the two sides of each
    file changed on both."""
    for side in ("a", "b"):
        os.mkdir(os.path.join(folder, side))
    for index, (old, new) in both.items():
        for side, data in (("a", old), ("b", new)):
            with open(os.path.join(folder, side, str(index)), "wb") as file:
                file.write(data)


async def _no_index_numstat(folder: str, env: Mapping[str, str], run: Git,
                            ) -> dict[int, tuple[int | None, int | None]]:
    # Exit status 1: the two sides differ.
    # Two folders of the harness's, no repository's: nothing of a checkout's git.
    out = await run("-C", folder, "diff", "--no-ext-diff", "--no-textconv", "--no-index",
                    "--no-renames", "--numstat",
                    "-z", "a", "b", env=git_env(env), ok_codes=(0, 1))
    # Each ``added<TAB>removed<TAB>`` then the two sides' names (``/dev/null`` for an
    # absent one): ``a/<index>``, ``b/<index>``.
    found: dict[int, tuple[int | None, int | None]] = {}
    fields = out.split("\0")
    i = 0
    while i + 2 < len(fields) and fields[i]:
        added, removed, _ = fields[i].split("\t", 2)
        name = fields[i + 2] if fields[i + 2] != "/dev/null" else fields[i + 1]
        i += 3
        index = name.rpartition("/")[2]
        if index.isdigit():
            found[int(index)] = (None if added == "-" else int(added),
                                 None if removed == "-" else int(removed))
    return found


def _raw(text: str) -> dict[str, tuple[str | None, str | None]]:
    """``diff-tree --raw -z``: ``:mA mB idA idB S`` then the path."""
    fields = text.split("\0")
    found: dict[str, tuple[str | None, str | None]] = {}
    i = 0
    while i + 1 < len(fields) and fields[i].startswith(":"):
        m_a, m_b, id_a, id_b, _ = fields[i][1:].split(" ", 4)
        found[fields[i + 1]] = (None if m_a == _NO_MODE else f"{m_a}:{id_a}",
                                None if m_b == _NO_MODE else f"{m_b}:{id_b}")
        i += 2
    return found


async def _optional(command: Awaitable[str]) -> str | None:
    """A git question whose "no" is its exit status 1 (no HEAD yet, detached):
    its one-line answer, or ``None``."""
    try:
        return (await command).strip() or None
    except GitError:
        return None
