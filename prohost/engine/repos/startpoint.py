"""Where a new private worktree (§5.1) starts: the source's commit, or, in a
repository with no commit yet, a branch of the lane's own.

:mod:`prohost.engine.repos.worktrees` calls :func:`start_point` with the source's
lock held, just before its ``git worktree add``.
"""

from __future__ import annotations

from prohost.engine.repos.gitcmd import GitError, GitTimedOut, git, git_env

#: Who the stand-in first commit of an empty repository is by (git needs someone,
#: and a daemon's git may know no user); with a fixed date, so every lane of one
#: repository shares that one object.
_EMPTY_START_ENV = {
    "GIT_AUTHOR_NAME": "prohost", "GIT_AUTHOR_EMAIL": "prohost@localhost",
    "GIT_COMMITTER_NAME": "prohost", "GIT_COMMITTER_EMAIL": "prohost@localhost",
    "GIT_AUTHOR_DATE": "@0 +0000", "GIT_COMMITTER_DATE": "@0 +0000",
}

#: Branches made for the worktrees of a repository with no commit yet: the lane
#: folder's name follows (ASCII letters, digits, ``_`` and ``-``: a valid ref name).
EMPTY_REPO_BRANCH_PREFIX = "prohost/"


async def start_point(src: str, folder_name: str) -> tuple[str, str | None]:
    """What a new worktree of ``src`` checks out, and the branch it will be on.

    Normally the source's ``HEAD``, detached (no branch). A source with no commit
    yet has no ``HEAD`` to check out, so its worktree starts from a commit of the
    empty tree (on no branch; no ref of the person's repository changes) and then
    goes on the branch ``prohost/<lane folder>``, unborn until the agent commits:
    the conversation can still edit and commit. If that branch already exists (an
    earlier worktree of this lane was collected), it is checked out instead.

    Cancelled: the git in flight is killed (:func:`~prohost.engine.repos.gitcmd.git`);
    at most the stand-in commit is left, on no branch, for git's gc to remove.
    """
    try:
        await git("-C", src, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
        return "HEAD", None
    except GitTimedOut:
        raise
    except GitError:
        pass  # no commit at HEAD: an empty repository (or an unborn branch)
    branch = EMPTY_REPO_BRANCH_PREFIX + folder_name
    try:
        await git("-C", src, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}")
        return branch, branch
    except GitTimedOut:
        raise
    except GitError:
        pass
    # hash-object (without -w) names the empty tree in the repo's own hash; git
    # knows that tree without storing it.
    tree = (await git("-C", src, "hash-object", "-t", "tree", "/dev/null")).strip()
    env = git_env()
    env.update(_EMPTY_START_ENV)
    commit = await git("-C", src, "commit-tree", tree, "-m",
                       "prohost: the repository had no commit yet", env=env)
    return commit.strip(), branch
