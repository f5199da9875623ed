"""Where a new private worktree (§5.1) starts: on the lane's own branch
``prohost/<lane folder>``, made from the source's ``HEAD`` the first time and
checked out again when it already exists (an earlier worktree of the lane was
collected: its commits live on in that branch).

:mod:`prohost.engine.repos.worktrees` calls :func:`start_point` with the source's
lock held, just before its ``git worktree add``.
"""

from __future__ import annotations

from typing import Literal

import attrs

from prohost.engine.repos.gitcmd import GitError, GitTimedOut, git, git_env

#: Who the stand-in first commit of an empty repository is by (git needs someone,
#: and a daemon's git may know no user); with a fixed date, so every lane of one
#: repository shares that one object.
EMPTY_START_ENV = {
    "GIT_AUTHOR_NAME": "prohost", "GIT_AUTHOR_EMAIL": "prohost@localhost",
    "GIT_COMMITTER_NAME": "prohost", "GIT_COMMITTER_EMAIL": "prohost@localhost",
    "GIT_AUTHOR_DATE": "@0 +0000", "GIT_COMMITTER_DATE": "@0 +0000",
}

#: Every lane's worktrees are on the branch this prefix plus the lane folder's
#: name (ASCII letters, digits, ``_`` and ``-``: a valid ref name).
BRANCH_PREFIX = "prohost/"
#: The older name of :data:`BRANCH_PREFIX`, from when only an empty repository's
#: worktrees had a branch.
EMPTY_REPO_BRANCH_PREFIX = BRANCH_PREFIX


def lane_branch(folder_name: str) -> str:
    """The branch a lane's worktrees are on: ``prohost/<lane folder>``."""
    return BRANCH_PREFIX + folder_name


@attrs.frozen
class StartPoint:
    """How to make a lane's new worktree of one source."""

    branch: str
    how: Literal["reuse", "create", "unborn"]
    """``reuse``: check the existing ``branch`` out; ``create``: make ``branch`` at
    the source's ``HEAD``; ``unborn``: the source has no commit, so check out
    ``commit`` (a stand-in of the empty tree) detached, then put the worktree on
    ``branch`` unborn, which the agent's first commit creates."""
    commit: str = "HEAD"

    def add_args(self, path: str) -> list[str]:
        """The arguments after ``git worktree add`` that make the worktree at ``path``."""
        if self.how == "reuse":
            return [path, self.branch]
        if self.how == "create":
            return ["-b", self.branch, path, self.commit]
        return ["--detach", path, self.commit]


async def start_point(src: str, folder_name: str) -> StartPoint:
    """Where a new worktree of ``src`` for the lane folder ``folder_name`` starts.

    The lane's branch when it exists (nothing it holds is lost by collecting a
    worktree); otherwise a new branch at the source's ``HEAD``. A source with no
    commit yet has no ``HEAD`` to branch from, so its worktree starts from a
    commit of the empty tree (on no branch; no ref of the person's repository
    changes) and then goes on the lane's branch, unborn until the agent commits.
    Raises :class:`GitError` when git refuses the branch's name.

    Cancelled: the git in flight is killed (:func:`~prohost.engine.repos.gitcmd.git`);
    at most the stand-in commit is left, on no branch, for git's gc to remove.
    """
    branch = lane_branch(folder_name)
    try:
        await git("check-ref-format", f"refs/heads/{branch}")
    except GitTimedOut:
        raise
    except GitError:
        raise GitError(f"git does not accept {branch!r} as a branch name") from None
    try:
        await git("-C", src, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}")
        return StartPoint(branch, "reuse", branch)
    except GitTimedOut:
        raise
    except GitError:
        pass  # the lane's first worktree of this source
    try:
        await git("-C", src, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
        return StartPoint(branch, "create")
    except GitTimedOut:
        raise
    except GitError:
        pass  # no commit at HEAD: an empty repository (or an unborn branch)
    # hash-object (without -w) names the empty tree in the repo's own hash; git
    # knows that tree without storing it.
    tree = (await git("-C", src, "hash-object", "-t", "tree", "/dev/null")).strip()
    env = git_env()
    env.update(EMPTY_START_ENV)
    commit = await git("-C", src, "commit-tree", tree, "-m",
                       "prohost: the repository had no commit yet", env=env)
    return StartPoint(branch, "unborn", commit.strip())
