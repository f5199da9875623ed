"""A worktree's git files as the harness made them, kept so (§13: the harness never
trusts what a run could write).

A linked worktree is tied to its repository by three small files: its ``.git``
(``gitdir: <common>/worktrees/<name>``), and in that git dir ``gitdir`` (the way
back) and ``commondir``. All three are in places the worktree's run may write.
git would follow whatever a run left there: another repository's config (whose
``core.fsmonitor`` git runs), the person's whole ``.git``, a link to anywhere. So
the harness records the git dir when it makes the worktree
(:func:`made_git_dir`), puts the three files back as they were before anything
looks at the worktree again (:func:`restore_git_files`), and removes a reflog a
run turned into a link before its own git appends to it
(:func:`remove_planted_logs`). Every function here is blocking, on real paths,
and follows no link.

A fourth file there is read by git only when the repository turns
``extensions.worktreeConfig`` on (a worktree of the person's repository made by an
earlier version, when the person's does): ``config.worktree``, settings of the
worktree's own, filter programs included. The harness never makes one (its lane
repositories do not turn it on), so one there is a run's: the git of the
harness's that reads a run's places outside a confinement refuses to
(:func:`planted_worktree_config`), and it is removed before anything else looks
(:func:`restore_git_files`).
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from prohost.engine.repos.gitcmd import GitPlaces

_WORKTREES = "worktrees"
#: The git dir's settings of its own (read with ``extensions.worktreeConfig``).
WORKTREE_CONFIG = "config.worktree"


def _gitdir_line(git_dir: str) -> str:
    return f"gitdir: {git_dir}\n"


def _read_regular(path: Path) -> str | None:
    """The text of the regular file at ``path``; ``None`` for anything else (absent,
    a link, a folder), read without following a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(65536)
    finally:
        os.close(fd)
    return data.decode("utf-8", "surrogateescape")


def own_git_dir(git_dir: str, common: str) -> bool:
    """``git_dir`` is a real folder directly in ``common``'s ``worktrees``."""
    return (os.path.dirname(git_dir) == os.path.join(common, _WORKTREES)
            and os.path.realpath(git_dir) == git_dir
            and os.path.isdir(git_dir) and not os.path.islink(git_dir))


def made_git_dir(path: Path, common: str) -> GitPlaces:
    """The places of the worktree git just made at ``path``, read from its
    ``.git`` file before any run has had it; ``OSError`` when that names no git
    dir of ``common``'s (git did something unexpected: the checkout fails)."""
    text = _read_regular(path / ".git")
    named = text[len("gitdir: "):].rstrip("\n") if text and text.startswith("gitdir: ") else ""
    git_dir = os.path.realpath(os.path.join(path, named)) if named else ""
    if not git_dir or not own_git_dir(git_dir, common):
        raise OSError(f"git made {path} without a git dir of its own in {common}")
    return GitPlaces(str(path), git_dir, common)


def adopt_git_dir(path: Path, common: str) -> tuple[str | None, bool]:
    """For a worktree with no record (made by an earlier version): its git dir, when
    its ``.git`` names one of ``common``'s that names it back; and whether it is
    another repository's instead (``foreign``). Anything else: ``(None, False)``."""
    text = _read_regular(path / ".git")
    if text is None or not text.startswith("gitdir: ") or text.count("\n") > 1:
        return None, False
    named = text[len("gitdir: "):].rstrip("\n")
    git_dir = os.path.realpath(os.path.join(path, named))
    if os.path.basename(os.path.dirname(git_dir)) == _WORKTREES and not own_git_dir(
            git_dir, common):
        return None, os.path.dirname(os.path.dirname(git_dir)) != common
    if not own_git_dir(git_dir, common):
        return None, False
    back = _read_regular(Path(git_dir) / "gitdir")
    if back is None or os.path.realpath(back.rstrip("\n")) != os.path.join(
            os.path.realpath(path), ".git"):
        return None, False
    return git_dir, False


def put_file(path: Path, text: str) -> bool:
    """Make ``path`` the regular file holding ``text``; whether it had to be
    changed. What was there (a link, a folder, other text) goes, unfollowed."""
    if _read_regular(path) == text:
        return False
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        pass
    else:
        if stat.S_ISDIR(mode):
            shutil.rmtree(path)  # links inside are removed, never followed
        else:
            os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    return True


def planted_worktree_config(places: GitPlaces) -> bool:
    """Whether the worktree's git dir holds a ``config.worktree`` (anything by that
    name, unfollowed): a run's, which no git outside a confinement may read."""
    return os.path.lexists(os.path.join(places.git_dir, WORKTREE_CONFIG))


def restore_git_files(places: GitPlaces) -> list[str]:
    """Put the worktree's ``.git``, and its git dir's ``gitdir`` and ``commondir``,
    back as git made them, and remove a ``config.worktree`` (the harness makes
    none); the names of those that a run had changed."""
    changed: list[str] = []
    planted = Path(places.git_dir) / WORKTREE_CONFIG
    if planted_worktree_config(places):
        if stat.S_ISDIR(os.lstat(planted).st_mode):
            shutil.rmtree(planted)  # links inside are removed, never followed
        else:
            os.unlink(planted)
        changed.append(WORKTREE_CONFIG)
    work_tree, git_dir = Path(places.work_tree), Path(places.git_dir)
    if put_file(work_tree / ".git", _gitdir_line(places.git_dir)):
        changed.append(".git")
    if put_file(git_dir / "gitdir", f"{os.path.realpath(work_tree) / Path('.git')}\n"):
        changed.append("gitdir")
    if put_file(git_dir / "commondir", "../..\n"):
        changed.append("commondir")
    return changed


def remove_planted_logs(places: GitPlaces, branch: str) -> None:
    """Before the harness's git updates ``branch`` (or HEAD) of the worktree at
    ``places``: a reflog it would append to that is not a regular file (a link a
    run made to a file of the person's) is removed, never appended through."""
    logs = [Path(places.common_dir) / "logs" / "refs" / "heads" / branch]
    if places.git_dir:
        logs.append(Path(places.git_dir) / "logs" / "HEAD")
    for log in logs:
        try:
            mode = os.lstat(log).st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(mode):
            shutil.rmtree(log)
        elif not stat.S_ISREG(mode):
            os.unlink(log)


def no_link_below(base: str, path: str) -> None:
    """Raise ``OSError`` when a part of ``path`` below ``base`` (a real path the
    harness trusts) is a symbolic link or missing: a grant made on ``path``
    would then follow a link a run could have planted (§13)."""
    relative = os.path.relpath(path, base)
    if relative.startswith(".."):
        raise OSError(f"{path} is not inside {base}")
    current = base
    for part in Path(relative).parts:
        if part == ".":
            continue
        current = os.path.join(current, part)
        if stat.S_ISLNK(os.lstat(current).st_mode):
            raise OSError(f"{current} is a symbolic link; no grant follows one")
