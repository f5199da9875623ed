"""Moving a conversation's worktree made by an earlier version into a repository
of the conversation's own (§13; issue 36 point 2, attack 5).

An earlier version made each conversation's checkout a linked worktree of the
person's repository (its ``.git`` names ``<person's .git>/worktrees/<name>``), and
its runs were granted the person's object store and ``prohost/`` branches: one
could overwrite an object the person's ``main`` reaches, read another
conversation's staged work or move its branch. So before such a conversation's
next run does anything, the harness moves the worktree to a lane repository
(:mod:`prohost.engine.repos.lanerepo`) as a new conversation gets, without
touching one of its files:

1. :func:`lay_out_repo` — the lane repository made afresh (what an interrupted
   move left there is removed: no run ever had it);
2. :func:`fetch_branches` — it fetches the conversation's branch (and the branch
   its worktree is on, when another) from the person's repository: git on the
   person's repository, with :data:`~prohost.engine.repos.gitcmd.HARDENED`
   settings, reading only refs (a ref a run made a link is refused) and
   objects, which the lane repository borrows anyway;
3. :func:`write_git_dir` — the worktree's git dir there, written by the harness:
   its ``HEAD`` (checked to be a branch or a commit, never followed), and the
   old git dir's index copied byte for byte (staged work kept, never read by an
   unconfined git on the old side);
4. :func:`own_objects` — what only the old worktree kept alive in the person's
   store (a detached ``HEAD``'s commits, staged blobs) packed into the lane
   repository's own, so the person's ``git gc`` cannot take it once the old
   registration is gone (the index, which a run wrote, read by a git inside
   the run room's confinement where there is one);
5. the caller records the new git dir in the lane marker: the move is done;
6. :func:`point` — the worktree's ``.git`` names the new git dir (what a later
   prepare also puts back, should this step not have happened);
7. :func:`forget` — the old git dir removed from the person's repository, as
   ``git worktree prune`` removes one: that folder only, never a file of the
   worktree's or the person's; the person's ``prohost/<lane folder>`` stays.

A failure before 5 leaves the old worktree as it was (the next run starts the
move again); after 5, the next prepare finishes it. Every function here either
is blocking (``def``) or runs bounded git (``async def``).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
from pathlib import Path

import trio

from prohost.engine.repos import lanerepo
from prohost.engine.repos.gitcmd import (
    HARDENED,
    GitError,
    GitPlaces,
    git,
    git_at,
    git_env,
    real_path,
    run_git,
)
from prohost.engine.repos.gitrecords import own_git_dir, restore_git_files
from prohost.engine.repos.startpoint import check_branch

log = logging.getLogger("prohost.worktrees")

_REF_HEAD = re.compile(r"ref: refs/heads/(\S+)\n?")
_COMMIT_HEAD = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?\n?")
_SHARED_INDEX = re.compile(r"sharedindex\.[0-9a-f]{40,64}")
#: A gitlink (a submodule's commit) in the index: an object of another repository.
_GITLINK = "160000"


class MoveFailed(Exception):
    """The worktree could not be moved; the message says why, in one line."""


def is_legacy(places: GitPlaces, person_common: str) -> bool:
    """The worktree at ``places`` is a worktree of the person's repository (made
    by an earlier version), not of a lane repository."""
    return places.common_dir == person_common


def _open_regular(path: Path) -> int | None:
    """A read descriptor on the regular file ``path`` (never through a link); ``None``
    when it is absent or anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def read_head(git_dir: Path, own: str) -> tuple[str, str | None]:
    """Blocking: the old git dir's ``HEAD`` as the new one will hold it, and the
    branch it names (``None``: detached). A ``HEAD`` that is neither a branch nor
    a commit (a link, anything a run wrote) becomes the lane's branch ``own``."""
    fd = _open_regular(git_dir / "HEAD")
    text = ""
    if fd is not None:
        with os.fdopen(fd, "rb") as handle:
            text = handle.read(512).decode("ascii", "replace")
    found = _REF_HEAD.fullmatch(text)
    if found:
        return f"ref: refs/heads/{found.group(1)}\n", found.group(1)
    if _COMMIT_HEAD.fullmatch(text):
        return text.strip() + "\n", None
    log.warning("the HEAD of %s named no branch or commit; the worktree is put on %s",
                git_dir, own)
    return f"ref: refs/heads/{own}\n", own


def lay_out_repo(repo: Path, person_common: str, object_format: str) -> None:
    """Blocking: step 1, a new lane repository at ``repo``."""
    lanerepo.lay_out(repo, person_common, object_format)


async def fetch_branches(repo: Path, person_common: str, branches: list[str]) -> None:
    """Step 2: ``repo`` gets each of ``branches`` the person's repository has, at
    its tip there. Raises :class:`GitError` (a name git refuses, a ref a run made
    a link, git failing). Cancelled: git is killed."""
    specs = []
    for branch in dict.fromkeys(branches):
        await check_branch(branch)
        if lanerepo.planted_ref(Path(person_common), branch):
            raise GitError(f"the branch {branch} of your repository is not a plain ref "
                           "(a link): remove it, then run the conversation again")
        ref = f"refs/heads/{branch}"
        tip = (await git("--git-dir", person_common, "rev-parse", "--verify", "--quiet",
                         f"{ref}^{{commit}}", ok_codes=(0, 1))).strip()
        if tip:
            specs.append(f"+{ref}:{ref}")
    if specs:
        await lanerepo.fetch_refs(repo, person_common, specs)


def _copy_regular(source: Path, target: Path) -> bool:
    """Copy the regular file ``source`` to the new file ``target``, never through a
    link; whether there was one to copy."""
    fd = _open_regular(source)
    if fd is None:
        return False
    with os.fdopen(fd, "rb") as reading:
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(out, "wb") as writing:
            shutil.copyfileobj(reading, writing)
    return True


def write_git_dir(repo: Path, old_git_dir: Path, head: str, work_tree: Path) -> GitPlaces:
    """Blocking: step 3, the worktree's git dir in the lane repository ``repo``
    (``HEAD``, ``commondir``, ``gitdir``, and the old index and its shared index
    files copied), as ``git worktree add`` lays one out; its places."""
    git_dir = repo / "worktrees" / work_tree.name
    if os.path.lexists(git_dir):
        shutil.rmtree(git_dir)  # an interrupted move's: never handed to a run
    git_dir.mkdir(parents=True)
    (git_dir / "HEAD").write_text(head)
    (git_dir / "commondir").write_text("../..\n")
    (git_dir / "gitdir").write_text(f"{real_path(work_tree)}/.git\n")
    _copy_regular(old_git_dir / "index", git_dir / "index")
    try:
        names = os.listdir(old_git_dir)
    except OSError:
        names = []
    for name in names:
        if _SHARED_INDEX.fullmatch(name):  # core.splitIndex: the index names it
            _copy_regular(old_git_dir / name, git_dir / name)
    common = real_path(repo)
    places = GitPlaces(str(work_tree), real_path(git_dir), common)
    if not own_git_dir(places.git_dir, common):
        raise OSError(f"{git_dir} is not a folder of {repo}'s worktrees")
    return places


async def _read_index(places: GitPlaces, confine: lanerepo.Confine | None,
                      *args: str) -> str:
    """``git *args`` on the index a run wrote (copied from the old git dir), with no
    work tree: inside ``confine`` when given (the lane repository readable,
    nothing writable), else with :data:`HARDENED` settings as every harness git."""
    argv = ["git", *HARDENED, "--git-dir", places.git_dir, *args]
    env = git_env()
    env["GIT_COMMON_DIR"] = places.common_dir
    if confine is None:
        return await run_git(argv, env=env)
    argv, fd = await trio.to_thread.run_sync(confine, argv, [Path(places.common_dir)], [],
                                             abandon_on_cancel=True)
    try:
        return await run_git(argv, env=env, pass_fds=() if fd is None else (fd,))
    finally:
        if fd is not None:
            os.close(fd)


async def own_objects(repo: Path, places: GitPlaces, person_common: str,
                      confine: lanerepo.Confine | None = None) -> int:
    """Step 4: the objects only the old worktree kept alive in the person's store
    (a detached ``HEAD``'s commits no branch of the person's reaches, the index's
    staged blobs) packed into ``repo``'s own store; how many. The index, which a
    run wrote, is read inside ``confine`` when given. Raises :class:`GitError`.
    Cancelled: git is killed (a half-written pack is git's temporary file, never
    used)."""
    head = (await git_at(places, "rev-parse", "--verify", "--quiet", "HEAD^{commit}",
                         ok_codes=(0, 1))).strip()
    ids: list[str] = []
    if head:
        # Asked of the person's repository: what its own branches, tags and
        # remote-tracking branches reach is kept by it (worktrees' HEADs are no
        # ref, so this worktree's own HEAD does not count).
        out = await git("--git-dir", person_common, "rev-list", "--objects", head,
                        "--not", "--branches", "--tags", "--remotes")
        ids += [line.split(" ", 1)[0] for line in out.splitlines() if line]
        # The index against HEAD: the staged blobs (no work-tree file is read).
        out = await _read_index(places, confine, "diff-index", "--cached", "--raw", "-z",
                                "--no-renames", "--no-abbrev", "--ignore-submodules=all", head)
        fields = out.split("\0")
        for meta in fields[0::2]:
            parts = meta.split(" ")
            if len(parts) == 5 and parts[1] != _GITLINK and parts[3].strip("0"):
                ids.append(parts[3])
    else:
        # No commit yet: everything the index holds is staged.
        out = await _read_index(places, confine, "ls-files", "--stage", "-z")
        for entry in out.split("\0"):
            parts = entry.split(" ")
            if len(parts) >= 3 and parts[0] != _GITLINK:
                ids.append(parts[1])
    ids = list(dict.fromkeys(ids))
    if ids:
        # One the old index names but no store holds (a run's doing) is nobody's
        # work to keep; asking pack-objects for it would fail every move.
        out = await git("--git-dir", str(repo), "cat-file", "--batch-check=%(objectname)",
                        stdin="".join(f"{oid}\n" for oid in ids).encode())
        ids = [line for line in out.splitlines() if line and not line.endswith(" missing")]
    if ids:
        await git("--git-dir", str(repo), "pack-objects", "-q",
                  str(repo / "objects" / "pack" / "pack"),
                  stdin="".join(f"{oid}\n" for oid in ids).encode())
    return len(ids)


def point(places: GitPlaces) -> None:
    """Blocking: step 6, the worktree's ``.git`` (and its git dir's ``gitdir`` and
    ``commondir``) naming the new git dir."""
    restore_git_files(places)


def forget(old_git_dir: str, person_common: str) -> bool:
    """Blocking: step 7, the old git dir removed from the person's repository (a
    real folder directly in its ``worktrees``: anything else is left); whether it
    was there. Links inside are removed, never followed."""
    if not own_git_dir(old_git_dir, person_common):
        return False
    shutil.rmtree(old_git_dir)
    return True
