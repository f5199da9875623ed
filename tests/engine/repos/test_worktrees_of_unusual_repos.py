"""Repositories a person may list in --repos that the plain case does not cover
(§5.1): one with no commit yet, one with submodules, and one whose own worktrees
live on a disk that is not mounted just now. Real git throughout."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import trio

from prohost.engine.repos.collect import collect_garbage
from prohost.engine.repos.worktrees import Checkout, WorktreeManager
from prohost.engine.run.prompt import PromptContext, build_prompt
from prohost.wire.runs import AgentRun
from tests.kits.repos import (
    git,
    make_repo,
    only,
    real,
    worktree_paths,
)

RUN = AgentRun(run_id="run_1", completion_path="/c", text="work", conversation_id="C1")


#: No git configuration of the machine reaches this module's repositories.
pytestmark = [pytest.mark.usefixtures("isolated_git"), pytest.mark.protocol("§5")]


def prompt_for(checkouts: tuple[Checkout, ...]) -> str:
    return build_prompt(RUN, PromptContext(timeout_s=0, idle_timeout_s=0, parallel=True,
                                           checkouts=checkouts))


async def git_fails(cwd: Path, *args: str) -> bool:
    done = await trio.run_process(["git", "-C", str(cwd), *args], capture_stdout=True,
                                  capture_stderr=True, check=False)
    return done.returncode != 0


# --- an empty repository (issue 20, point 12) ---------------------------------------


async def test_an_empty_repository_gets_a_worktree_the_agent_can_commit_in(
    tmp_path: Path,
) -> None:
    with trio.fail_after(30):
        source = tmp_path / "app"
        source.mkdir()
        await git(source, "init", "-q", "-b", "main")  # no commit yet
        manager = WorktreeManager(tmp_path / "home", [source])
        prepared = await manager.prepare("conv:C1")
        assert prepared.failures == ()  # was: read-only, "invalid reference: HEAD"
        (checkout,) = prepared.checkouts
        path = Path(checkout.path)
        branch = "prohost/C1"
        assert checkout.branch == branch and checkout.unborn
        # Nothing in the person's repository changed: no branch, HEAD still unborn.
        assert await git(source, "for-each-ref") == ""
        assert "No commits yet" in await git(path, "status")
        assert (await git(path, "symbolic-ref", "HEAD")).strip() == f"refs/heads/{branch}"

        prompt = prompt_for(prepared.checkouts)
        assert f"on its own branch {branch}" in prompt
        assert "The original has no commit yet: that branch does not exist" in prompt
        assert "No private checkout could be prepared" not in prompt

        # The agent edits and commits there, as in a fresh `git init`.
        (path / "hello.txt").write_text("hi\n")
        await git(path, "add", "hello.txt")
        await git(path, "commit", "-q", "-m", "first")
        assert (await git(path, "rev-list", "--count", "HEAD")).strip() == "1"  # no stand-in
        await manager.bring_back(prepared)  # what the run's end does
        assert await git_fails(source, "rev-parse", "--verify", "--quiet", "HEAD")
        assert (await git(source, "show", f"{branch}:hello.txt")) == "hi\n"

        # The next turn finds that work; another conversation gets its own branch.
        again = await manager.prepare("conv:C1")
        assert only(again.checkouts) == path and not again.checkouts[0].unborn
        other = await manager.prepare("conv:C2")
        assert other.failures == ()
        assert other.checkouts[0].branch == "prohost/C2"
        assert other.checkouts[0].unborn
        assert sorted(await worktree_paths(source, tmp_path / "home")) == real(
            source, path, Path(other.checkouts[0].path))


async def test_a_collected_empty_repository_worktree_finds_its_branch_again(
    tmp_path: Path,
) -> None:
    with trio.fail_after(30):
        source = tmp_path / "app"
        source.mkdir()
        await git(source, "init", "-q", "-b", "main")
        home = tmp_path / "home"
        manager = WorktreeManager(home, [source])
        prepared = await manager.prepare("conv:C1")
        path = only(prepared.checkouts)
        (path / "a.txt").write_text("a\n")
        await git(path, "add", "a.txt")
        await git(path, "commit", "-q", "-m", "a")
        await manager.bring_back(prepared)  # what the run's end does
        # `agent gc` removes the idle conversation's worktree; its branch stays.
        await collect_garbage(home, older_than_s=0, dry_run=False, force=False,
                              now=time.time() + 60)
        assert not path.exists()
        again = await WorktreeManager(home, [source]).prepare("conv:C1")
        assert again.failures == ()
        assert (only(again.checkouts) / "a.txt").read_text() == "a\n"


async def test_an_unused_empty_repository_worktree_is_collected(tmp_path: Path) -> None:
    with trio.fail_after(30):
        source = tmp_path / "app"
        source.mkdir()
        await git(source, "init", "-q", "-b", "main")
        home = tmp_path / "home"
        path = only((await WorktreeManager(home, [source]).prepare("conv:C1")).checkouts)
        # Its branch never got a commit and nothing is in it: nothing to lose.
        entries = await collect_garbage(home, older_than_s=0, dry_run=False, force=False,
                                        now=time.time() + 60)
        assert [entry.action for entry in entries] == ["removed"], entries
        assert not path.exists()
        assert await worktree_paths(source) == real(source)


# --- submodules (issue 20, point 12) -------------------------------------------------


async def test_the_prompt_says_submodules_are_empty_in_the_private_checkout(
    tmp_path: Path,
) -> None:
    with trio.fail_after(30):
        lib = await make_repo(tmp_path / "lib")
        source = await make_repo(tmp_path / "app")
        await git(source, "-c", "protocol.file.allow=always", "submodule", "add", "-q",
                  str(lib), "vendor/lib")
        await git(source, "commit", "-q", "-m", "a submodule")
        plain = await make_repo(tmp_path / "plain")
        prepared = await WorktreeManager(tmp_path / "home", [source, plain]).prepare("conv:1")
        assert prepared.failures == ()
        with_sub, without = prepared.checkouts
        # What the agent would find: the submodule's folder is there, and empty.
        assert os.listdir(Path(with_sub.path) / "vendor" / "lib") == []
        assert with_sub.has_submodules and not without.has_submodules
        prompt = prompt_for(prepared.checkouts)
        app_at = prompt.index(f"    app: {with_sub.path}")
        plain_at = prompt.index(f"    plain: {without.path}")
        note = "      Its submodules are not checked out here (their folders are"
        assert app_at < prompt.index(note) < plain_at
        assert prompt.count(note) == 1
        assert "empty): read them in the original, and do not change them." in prompt


# --- git worktree prune (issue 20, point 13) ---------------------------------------


async def test_the_persons_own_missing_worktrees_are_never_pruned(tmp_path: Path) -> None:
    """A worktree of the person's own on a disk that is not mounted right now: its
    folder is missing, and a `git worktree prune` would forget it for good."""
    with trio.fail_after(30):
        source = await make_repo(tmp_path / "app")
        mine = tmp_path / "usb" / "feature"
        await git(source, "worktree", "add", "-q", "-b", "feature", str(mine))
        (mine / "wip.txt").write_text("mine\n")
        unmounted = tmp_path / "usb-unplugged"
        os.rename(tmp_path / "usb", unmounted)
        (registered,) = real(mine)
        assert registered in await worktree_paths(source)

        home = tmp_path / "home"
        manager = WorktreeManager(home, [source])
        lane_path = only((await manager.prepare("conv:1")).checkouts)
        assert registered in await worktree_paths(source)  # creating one does not prune

        entries = await collect_garbage(home, older_than_s=0, dry_run=False, force=False,
                                        now=time.time() + 60)
        assert [entry.action for entry in entries] == ["removed"]
        assert real(lane_path)[0] not in await worktree_paths(source)
        assert registered in await worktree_paths(source)  # nor does the daily pass

        # The disk comes back: the person's worktree works as before.
        os.rename(unmounted, tmp_path / "usb")
        assert (await git(mine, "symbolic-ref", "--short", "HEAD")).strip() == "feature"
        assert "wip.txt" in await git(mine, "status", "--porcelain")

