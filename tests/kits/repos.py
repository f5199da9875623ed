"""Real git for tests: repositories made in ``tmp_path`` with no configuration of the
machine's own, the worktrees git lists, and a home with a worktree per lane.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import trio

from prohost.engine.repos.lanerepo import REPOS_FOLDER
from prohost.engine.repos.worktrees import WorktreeManager
from prohost.engine.run.prompt import Checkout

USER = ("-c", "user.name=Prohost Test", "-c", "user.email=test@example.invalid")


def isolate_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No global or system git config of the machine running the tests (signing,
    hook paths, advice) reaches these repositories."""
    config = tmp_path / "gitconfig"
    config.write_text(
        "[user]\n\tname = Prohost Test\n\temail = test@example.invalid\n"
        "[commit]\n\tgpgsign = false\n[advice]\n\tdetachedHead = false\n"
    )
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_COMMON_DIR"):
        monkeypatch.delenv(name, raising=False)


async def git(cwd: Path, *args: str) -> str:
    done = await trio.run_process(
        ["git", "-C", str(cwd), *USER, *args],
        stdin=subprocess.DEVNULL,
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert done.returncode == 0, (args, done.stderr.decode())
    return done.stdout.decode()


async def make_repo(path: Path, files: dict[str, str] | None = None) -> Path:
    """A repository at ``path`` on branch main with one commit of ``files``."""
    await trio.Path(path).mkdir(parents=True)
    await git(path, "init", "-q", "-b", "main")
    await git(path, "config", "user.name", "Prohost Test")
    await git(path, "config", "user.email", "test@example.invalid")
    for name, text in (files or {"README": f"{path.name}\n"}).items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    await git(path, "add", "-A")
    await git(path, "commit", "-q", "-m", "first")
    return path


async def commit_file(repo: Path, name: str, text: str) -> str:
    (repo / name).write_text(text)
    await git(repo, "add", name)
    await git(repo, "commit", "-q", "-m", f"add {name}")
    return (await git(repo, "rev-parse", "HEAD")).strip()


async def worktree_paths(source: Path, home: Path | None = None) -> list[str]:
    """What `git worktree list` of ``source`` lists, the main checkout included; with
    ``home``, and the worktrees of its conversations' own repositories (each a
    repository of its own, ``prohost.engine.repos.lanerepo``)."""
    out = await git(source, "worktree", "list", "--porcelain")
    prefix = "worktree "
    found = [line.removeprefix(prefix) for line in out.splitlines() if line.startswith(prefix)]
    for repo in sorted((home / "worktrees").glob(f"*/{REPOS_FOLDER}/*.git")) if home else ():
        out = await git(repo, "--git-dir", str(repo), "worktree", "list", "--porcelain")
        for entry in out.split("\n\n"):
            lines = entry.splitlines()
            if lines and "bare" not in lines:
                found.append(lines[0].removeprefix(prefix))
    return found


def real(*paths: Path) -> list[str]:
    """As `git worktree list` shows them: symlinks resolved (macOS's /var), sorted."""
    return sorted(os.path.realpath(path) for path in paths)


def only(prepared_checkouts: tuple[Checkout, ...]) -> Path:
    (checkout,) = prepared_checkouts
    return Path(checkout.path)


async def make_readme_repo(path: Path) -> Path:
    """A repository at ``path`` on branch main with one commit of ``README.md``
    (``hello``), committed without any git configuration."""
    await trio.Path(path).mkdir(parents=True)
    await trio.Path(path / "README.md").write_text("hello\n")
    for args in (["init", "-q", "-b", "main"], ["add", "README.md"],
                 ["-c", "user.name=t", "-c", "user.email=t@example.com",
                  "commit", "-q", "-m", "first"]):
        await trio.run_process(["git", "-C", str(path), *args])
    return path


def lane_folder(home: Path, lane: str) -> Path:
    """``lane``'s worktrees folder in ``home`` as the harness names it: from its
    record (:mod:`prohost.engine.repos.lanenames`), named now if it has none yet,
    as the harness's first prepare of it would."""
    return WorktreeManager(home, []).lane_folder(lane)


def lane_branch_in(home: Path, lane: str) -> str:
    """The branch of ``lane``'s worktrees, ``prohost/<its folder>``."""
    return "prohost/" + lane_folder(home, lane).name


class Lanes:
    """A home with one source repo and a worktree for each named lane."""

    def __init__(self, home: Path, source: Path, paths: dict[str, Path]) -> None:
        self.home = home
        self.source = source
        self.paths = paths

    def folder(self, lane: str) -> Path:
        return lane_folder(self.home, lane)


async def lanes(tmp_path: Path, *names: str) -> Lanes:
    source = await make_repo(tmp_path / "app")
    home = tmp_path / "home"
    manager = WorktreeManager(home, [source])
    paths = {}
    for name in names:
        (checkout,) = (await manager.prepare(name)).checkouts
        paths[name] = Path(checkout.path)
    return Lanes(home, source, paths)
