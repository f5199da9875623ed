"""A conversation's worktree as an earlier version of prohost made it (a worktree of the
person's repository), and the steps of its move into the conversation's own
repository."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TypeVar

import pytest

from prohost.engine.repos import migrate, worktrees
from prohost.engine.repos.lanemarker import LANE_MARKER, read_marker
from prohost.engine.repos.lanerepo import lane_repo
from prohost.engine.repos.worktrees import WorktreeManager, lane_folder_name
from tests.kits.repos import commit_file, git, make_repo

T = TypeVar("T")


LANE = "conv:L"


async def make_legacy_lane(home: Path, source: Path, lane: str) -> Path:
    """A lane folder as the version before the conversations' own repositories
    (85a4e3e) left it: ``git worktree add -b prohost/<lane folder> <path> HEAD``
    of the person's repository, and a marker with no ``git_dirs``. Returns the
    worktree."""
    folder = home / "worktrees" / lane_folder_name(lane)
    path = folder / source.name.lstrip(".")
    await git(source, "worktree", "add", "-b", f"prohost/{folder.name}", str(path), "HEAD")
    (folder / LANE_MARKER).write_text(json.dumps(
        {"lane": lane, "last_used": time.time(), "ready": {path.name: str(source)}},
        sort_keys=True) + "\n")
    return path


def single(items: tuple[T, ...]) -> T:
    assert len(items) == 1, items
    return items[0]


class Legacy:
    """A person's repository and a conversation of an earlier version with work
    of every kind in it: a commit on its branch, a file changed and not staged,
    a file staged and then changed again, a new file staged only, an untracked
    file and an ignored one."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.home = tmp_path / "home"
        self.source = tmp_path / "app"
        self.path = Path()
        self.branch = f"prohost/{lane_folder_name(LANE)}"

    async def make(self) -> None:
        await make_repo(self.source, {"README": "hello\n", "notes.txt": "one\n",
                                      ".gitignore": "*.log\n"})
        self.path = await make_legacy_lane(self.home, self.source, LANE)
        self.tip = await commit_file(self.path, "work.txt", "turn 1\n")
        (self.path / "README").write_text("hello, changed, not staged\n")
        (self.path / "notes.txt").write_text("staged version\n")
        await git(self.path, "add", "notes.txt")
        (self.path / "notes.txt").write_text("changed again after staging\n")
        (self.path / "new.txt").write_text("only staged, never committed\n")
        await git(self.path, "add", "new.txt")
        (self.path / "untracked.txt").write_text("untracked\n")
        (self.path / "run.log").write_text("ignored\n")
        self.files = files_of(self.path)
        self.status = await self.porcelain()
        self.dot_git = (self.path / ".git").read_bytes()
        self.old_git_dir = self.source / ".git" / "worktrees" / self.path.name

    async def porcelain(self) -> str:
        return await git(self.path, "status", "--porcelain=v1", "-uall", "--ignored")

    def manager(self) -> WorktreeManager:
        return WorktreeManager(self.home, [self.source])

    async def assert_untouched(self) -> None:
        """The old worktree as it was: its ``.git``, git dir, files and status."""
        assert (self.path / ".git").read_bytes() == self.dot_git
        assert self.old_git_dir.is_dir()
        assert files_of(self.path) == self.files
        assert await self.porcelain() == self.status

    async def assert_moved(self) -> None:
        """Moved, every piece of work kept, nothing of it left in the person's
        repository but its branch."""
        repo = lane_repo(self.path.parent, self.path.name).resolve()
        assert (self.path / ".git").read_text() == f"gitdir: {repo}/worktrees/app\n"
        assert files_of(self.path) == self.files
        assert await self.porcelain() == self.status
        assert (await git(self.path, "show", ":notes.txt")) == "staged version\n"
        assert (await git(self.path, "symbolic-ref", "--short", "HEAD")).strip() == self.branch
        assert (await git(self.path, "rev-parse", "HEAD")).strip() == self.tip
        assert (await git(self.source, "rev-parse", self.branch)).strip() == self.tip
        assert not self.old_git_dir.exists()
        listed = await git(self.source, "worktree", "list", "--porcelain")
        assert str(self.path) not in listed
        marker = read_marker(self.path.parent)
        assert marker.git_dirs == {"app": f"{repo}/worktrees/app"}
        assert not marker.moved
        await git(self.source, "fsck", "--no-progress", "--strict")


@pytest.fixture(name="legacy")
async def legacy_fixture(tmp_path: Path) -> Legacy:
    world = Legacy(tmp_path)
    await world.make()
    return world


#: Each step of a move, where a test makes it fail: (module, name).
STEPS = [(migrate, "read_head"), (migrate, "lay_out_repo"), (migrate, "fetch_branches"),
         (migrate, "write_git_dir"), (migrate, "own_objects"), (worktrees, "record_move"),
         (migrate, "point"), (migrate, "forget")]


def files_of(path: Path) -> dict[str, bytes]:
    """Every file of the worktree but its ``.git``, by relative path, with its bytes."""
    found = {}
    for root, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in names:
            if name != ".git":
                full = Path(root) / name
                found[str(full.relative_to(path))] = full.read_bytes()
    return found
