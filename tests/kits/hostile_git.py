"""A person's machine for the hostile-git tests (§13): the hostile git agent, a ``World``
with a repository, and a turn's reply."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kits.harness import finished
from tests.kits.paths import AGENTS
from tests.kits.repos import isolate_git, lane_branch_in, lane_folder

HOSTILE = shlex.join([sys.executable, str(AGENTS / "hostile_git.py")])


#: How §13 says a denied write and a denied read fail.
DENIED_WRITE = {"EACCES", "EPERM", "EROFS"}


class World:
    """A person's machine: a home with dotfiles, a checkout with a Makefile, the
    harness's home beside them, and a folder no run may write (for markers)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.user = tmp_path / "user"
        self.user.mkdir()
        self.bashrc = self.user / ".bashrc"
        self.bashrc.write_text("export EDITOR=vi\n")
        self.home = tmp_path / "home"
        self.source = tmp_path / "src" / "app"
        self.outside = tmp_path / "outside"
        self.outside.mkdir()
        self.marker = self.outside / "ran"
        self.env = {**os.environ, "HOME": str(self.user),
                    "GIT_AUTHOR_NAME": "Agent", "GIT_AUTHOR_EMAIL": "agent@example.invalid",
                    "GIT_COMMITTER_NAME": "Agent",
                    "GIT_COMMITTER_EMAIL": "agent@example.invalid"}

    def worktree(self, conversation: str) -> Path:
        return lane_folder(self.home, f"conv:{conversation}") / "app"

    def branch(self, conversation: str) -> str:
        return lane_branch_in(self.home, f"conv:{conversation}")

    def git(self, *args: str) -> str:
        done = subprocess.run(["git", "-C", str(self.source), *args], capture_output=True,
                              text=True, check=False)
        assert done.returncode == 0, (args, done.stderr)
        return done.stdout

    def original_git_files(self) -> dict[str, bytes]:
        """The original's config and hooks, byte for byte."""
        git_dir = self.source / ".git"
        files = {"config": (git_dir / "config").read_bytes()}
        for hook in sorted((git_dir / "hooks").iterdir()):
            files[hook.name] = hook.read_bytes()
        return files


@pytest.fixture(name="world")
def world_fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    isolate_git(tmp_path, monkeypatch)
    yield World(tmp_path)


async def turn(server: Any, conversation: str, *attack: str) -> dict[str, Any]:
    run_id = await server.submit_run("DO: " + " ".join(attack), conversation_id=conversation)
    await server.wait_until(finished(run_id))
    completion: dict[str, Any] = server.run(run_id).completion
    assert completion is not None, run_id
    return completion


def reply(completion: dict[str, Any]) -> str:
    assert completion["ok"] is True, completion
    text: str = completion["reply"].strip()
    return text
