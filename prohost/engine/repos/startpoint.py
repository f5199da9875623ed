"""The lane's branch, ``prohost/<lane folder>``, and how a new private worktree
(§5.1) starts on it (:class:`StartPoint`): the branch checked out when it exists
(an earlier worktree of the lane was collected: its commits live on in that
branch), else made from the source's ``HEAD``, or unborn for a source with no
commit. Where it is decided: :func:`prohost.engine.repos.lanerepo.lane_start`.
"""

from __future__ import annotations

from typing import Literal

import attrs

from prohost.engine.repos.gitcmd import GitError, GitTimedOut, git

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
    how: Literal["reuse", "unborn"]
    """``reuse``: check the existing ``branch`` out (made first in the lane's
    repository when new); ``unborn``: the source has no commit, so check out
    ``commit`` (a stand-in of the empty tree) detached, then put the worktree on
    ``branch`` unborn, which the agent's first commit creates."""
    commit: str = "HEAD"

    def add_args(self, path: str) -> list[str]:
        """The arguments after ``git worktree add`` that make the worktree at ``path``."""
        if self.how == "reuse":
            return [path, self.branch]
        return ["--detach", path, self.commit]


async def check_branch(branch: str) -> None:
    """Raise :class:`GitError` saying so plainly when git refuses ``branch`` as a
    branch name (no lane folder name can be one, but git is the judge)."""
    try:
        await git("check-ref-format", f"refs/heads/{branch}")
    except GitTimedOut:
        raise
    except GitError:
        raise GitError(f"git does not accept {branch!r} as a branch name") from None
