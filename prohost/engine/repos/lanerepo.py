"""A conversation's own git repository (§13: the person's repository changes only
by the conversation's own branch).

Each lane's worktree of a ``--repos`` checkout is a linked worktree, not of the
person's repository, but of a repository of the lane's own::

    $PROHOST_HOME/worktrees/<lane folder>/.prohost-repos/<name>.git

Its objects folder borrows the person's object store as an alternate (read only:
no run may write the person's repository), so a new one costs a few files, not a
copy. Its config, hooks and ``info/`` are the harness's (only the config's
``include`` of the person's own, for their filters, identity and remotes); a run
may write its objects, its ``prohost/`` branches and its worktree's git dir,
which no other conversation's run can read (``$PROHOST_HOME`` is hidden from
each) — so no run reads another's staged work, moves another's branch, or
overwrites an object of the person's.

The harness brings the branch back after each run (:func:`bring_back`): the
person's repository fetches ``prohost/<lane folder>`` from the lane's repository,
git checking every object it receives, updating that one ref and nothing else.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import trio

from prohost.engine.repos.gitcmd import HARDENED, GitError, git, git_env, run_git
from prohost.engine.repos.gitrecords import put_file
from prohost.engine.repos.startpoint import EMPTY_START_ENV, StartPoint, check_branch

log = logging.getLogger("prohost.worktrees")

#: The folder, in a lane folder, of the lane's own repositories.
REPOS_FOLDER = ".prohost-repos"

#: Given to the one git that fetches from a lane's repository: a local path is
#: git's ``file`` protocol, which :data:`~prohost.engine.repos.gitcmd.HARDENED`
#: turns off with every other. No automatic gc or maintenance runs after it.
_FETCH = ("-c", "protocol.file.allow=always", "-c", "gc.auto=0",
          "-c", "maintenance.auto=false", "-c", "fetch.writeCommitGraph=false")


def lane_repo(folder: Path, name: str) -> Path:
    """Where the lane folder ``folder`` keeps its repository of the checkout ``name``."""
    return folder / REPOS_FOLDER / f"{name}.git"


def _config(person_common: str) -> str:
    # The person's config first, so that every line after it wins: this is a
    # bare repository (its worktrees are linked ones) that logs its refs.
    quoted = person_common.replace("\\", "\\\\").replace('"', '\\"')
    return (f'[include]\n\tpath = "{quoted}/config"\n'
            "[core]\n\trepositoryformatversion = 0\n\tbare = true\n"
            "\tlogallrefupdates = true\n")


def lay_out(repo: Path, person_common: str, object_format: str) -> None:
    """Blocking: a new bare repository at ``repo`` (none there: made afresh, what a
    killed making left removed first), its objects behind the person's."""
    if os.path.lexists(repo):
        shutil.rmtree(repo)  # never handed to a run: the leftovers of a killed prepare
    repo.parent.mkdir(parents=True, exist_ok=True)
    repo.mkdir()
    for folder in ("objects/info", "objects/pack", "refs/heads/prohost", "refs/tags",
                   "logs/refs/heads/prohost", "worktrees", "info"):
        (repo / folder).mkdir(parents=True)
    (repo / "HEAD").write_text("ref: refs/heads/prohost\n")
    config = _config(person_common)
    if object_format != "sha1":
        config = config.replace("repositoryformatversion = 0", "repositoryformatversion = 1")
        config += f"[extensions]\n\tobjectformat = {object_format}\n"
    (repo / "config").write_text(config)
    (repo / "objects" / "info" / "alternates").write_text(
        os.path.join(person_common, "objects") + "\n")


async def object_format(source: str) -> str:
    """The object format (``sha1``, ``sha256``) of the person's repository
    ``source``, which its lane repositories share. Cancelled: git is killed."""
    out = await git("-C", source, "rev-parse", "--show-object-format")
    return out.strip() or "sha1"


def planted_ref(repo: Path, branch: str) -> bool:
    """Blocking: the lane repository's ``branch`` is not a regular file (a link a
    run made): git would read through it, so it is not brought back."""
    try:
        return not stat.S_ISREG(os.lstat(repo / "refs" / "heads" / branch).st_mode)
    except FileNotFoundError:
        return False


#: Makes a command line run confined (the run room's, from the sandbox): ``argv``,
#: the folders it may read though hidden, the folders it may write; the command
#: line, and a descriptor to pass to it (``None``: none; bubblewrap reads its filter
#: on Unix sockets from it), which the spawner closes once it has spawned. Blocking.
Confine = Callable[[list[str], Sequence[Path], Sequence[Path]], tuple[list[str], int | None]]


async def bring_back(repo: Path, person_common: str, branch: str,
                     confine: Confine | None = None,
                     scratch_root: Path | None = None) -> str | None:
    """Update the person's ``branch`` to the lane repository's (its objects checked
    by git as they arrive); the new tip, or ``None`` when the lane has no such
    branch. Raises :class:`GitError` (the person's branch is then as it was).

    With ``confine`` (where runs can be confined), everything that reads the lane
    repository, which its runs may write (objects, packs, refs, alternates), runs
    confined: ``git bundle create`` there writes the branch's new objects into a
    file in a scratch folder under ``scratch_root``, and the person's repository
    fetches that file, as it would a download, updating that one ref. Without,
    the person's repository fetches from the lane repository directly (``git
    upload-pack`` there, with the harness's config).

    Cancelled: git (and its confinement) is killed; the person's ref is updated
    whole or not, and the scratch folder is removed."""
    ref = f"refs/heads/{branch}"
    if planted_ref(repo, branch):
        raise GitError(f"{branch} in the conversation's repository is not a plain ref")
    tip = (await git("--git-dir", str(repo), "rev-parse", "--verify", "--quiet", ref,
                     ok_codes=(0, 1))).strip()
    if not tip:
        return None
    fetch = (*_FETCH, "--git-dir", person_common, "fetch", "--quiet", "--no-tags",
             "--no-write-fetch-head", "--no-recurse-submodules")
    if confine is None or scratch_root is None:
        await git(*fetch, str(repo), f"+{ref}:{ref}")
        return tip
    have = [(await git("--git-dir", person_common, "rev-parse", "--verify", "--quiet",
                       f"{name}^{{commit}}", ok_codes=(0, 1))).strip()
            for name in (ref, "HEAD")]
    if tip == have[0]:
        return tip  # nothing new
    if tip == have[1]:
        # At the person's HEAD (no commit of the run's yet): a commit the person's
        # repository itself named, so the ref is made without reading anything
        # of the lane's.
        await git("--git-dir", person_common, "update-ref", ref, tip, have[0])
        return tip
    scratch = await trio.to_thread.run_sync(_scratch, scratch_root, abandon_on_cancel=True)
    try:
        bundle = scratch / "branch.bundle"
        argv, fd = await trio.to_thread.run_sync(
            confine, ["git", *HARDENED, "--git-dir", str(repo), "bundle", "create",
                      "--quiet", str(bundle), ref, *(f"^{h}" for h in have if h)],
            [repo], [scratch], abandon_on_cancel=True)
        try:
            await run_git(argv, pass_fds=() if fd is None else (fd,))
        finally:
            if fd is not None:
                os.close(fd)
        await git(*fetch, str(bundle), f"+{ref}:{ref}")
    finally:
        # Shielded and bounded: a hung disk leaves the folder to the next start's
        # sweep of the scratch folders rather than holding a cancel.
        with trio.CancelScope(shield=True, deadline=trio.current_time() + _CLEANUP_S):
            await trio.to_thread.run_sync(shutil.rmtree, scratch, True,
                                          abandon_on_cancel=True)
    return tip


#: How long removing a bring-back's scratch folder may hold a cancel, in seconds.
_CLEANUP_S = 10.0


def _scratch(root: Path) -> Path:
    """Blocking: a new private folder under ``root`` for one bring-back's bundle."""
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="bring-back-", dir=root))


async def lane_start(repo: Path, source: str, branch: str) -> StartPoint:
    """Where the lane's new worktree in its repository ``repo`` starts: the lane's
    branch when that repository has it; else made there at the person's branch of
    that name (a collected lane's work lives on in it), or at the person's
    ``HEAD``; for a person's repository with no commit, a stand-in commit of the
    empty tree, made in the lane's repository (nothing of the person's changes).

    Raises :class:`GitError` when git refuses the branch's name.

    Cancelled: the git in flight is killed; a branch made is the lane's own."""
    await check_branch(branch)
    ref = f"refs/heads/{branch}"
    lane = ("--git-dir", str(repo))
    if (await git(*lane, "rev-parse", "--verify", "--quiet", ref, ok_codes=(0, 1))).strip():
        return StartPoint(branch, "reuse", branch)
    for name in (ref, "HEAD"):
        tip = (await git("-C", source, "rev-parse", "--verify", "--quiet",
                         f"{name}^{{commit}}", ok_codes=(0, 1))).strip()
        if tip:
            await git(*lane, "update-ref", ref, tip, "")
            return StartPoint(branch, "reuse", branch)
    tree = (await git(*lane, "hash-object", "-t", "tree", "/dev/null")).strip()
    env = git_env()
    env.update(EMPTY_START_ENV)
    commit = await git(*lane, "commit-tree", tree, "-m",
                       "prohost: the repository had no commit yet", env=env)
    return StartPoint(branch, "unborn", commit.strip())


def lane_repo_usable(repo: Path) -> bool:
    """Blocking: ``repo`` is a lane repository the harness finished making (its
    config, which no run may write, is there: :func:`lay_out` writes it last but
    one), not a link."""
    return (os.path.isdir(repo) and not os.path.islink(repo)
            and os.path.isfile(repo / "config") and not os.path.islink(repo / "config"))


def restore_alternates(repo: Path, person_common: str) -> bool:
    """Blocking: put the lane repository's alternates back as made (it is in its
    objects folder, which its runs may write), so that its git, and the
    harness's, borrow the person's store and nothing else; whether it had
    changed. Follows no link: a planted ``objects/info`` link is removed."""
    info = repo / "objects" / "info"
    if info.is_symlink() or (os.path.lexists(info) and not info.is_dir()):
        os.unlink(info)
    info.mkdir(parents=True, exist_ok=True)
    return put_file(info / "alternates", os.path.join(person_common, "objects") + "\n")


async def sync_refs(repo: Path, person_common: str) -> None:
    """Give the lane's repository the person's branches, remote-tracking branches
    and tags as they are now (``main``, ``origin/main``, … resolve in the worktree
    as in the person's checkout), never its own ``prohost/…`` branches. Their
    objects are already there (the alternate): only refs are written, in places
    no run may write. Raises :class:`GitError` (the refs stay as they were: a
    branch the agent checked out is not moved under it).

    Cancelled: the fetch is killed; each ref is updated whole or not."""
    await fetch_refs(repo, person_common,
                     ("+refs/heads/*:refs/heads/*", "^refs/heads/prohost/*",
                      "+refs/remotes/*:refs/remotes/*", "+refs/tags/*:refs/tags/*"))


async def fetch_refs(repo: Path, person_common: str, refspecs: Sequence[str]) -> None:
    """The lane's repository ``repo`` fetches ``refspecs`` from the person's
    repository (its objects are there already, through the alternate: only refs
    are written). Raises :class:`GitError`.

    Cancelled: the fetch is killed; each ref is updated whole or not."""
    await git(*_FETCH, "--git-dir", str(repo), "fetch", "--quiet", "--no-tags",
              "--no-write-fetch-head", "--no-recurse-submodules", person_common,
              *refspecs)
