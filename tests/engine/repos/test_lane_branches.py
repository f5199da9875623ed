"""Each conversation's worktrees on a branch of its own, ``prohost/<conversation>``
(§5.1, issue 31 point 5), with real git in tmp_path."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import trio

from prohost.engine.repos.collect import collect_garbage
from prohost.engine.repos.gitcmd import GitError
from prohost.engine.repos.startpoint import check_branch
from prohost.engine.repos.worktrees import WorktreeManager
from prohost.engine.run.prompt import PromptContext, build_prompt
from prohost.wire.runs import AgentRun
from tests.kits.repos import commit_file, git, make_repo, only

#: No git configuration of the machine reaches this module's repositories.
pytestmark = [pytest.mark.usefixtures("isolated_git"), pytest.mark.protocol("§5")]

DAY = 86400.0


def branch_of(lane: str) -> str:
    """A conversation's branch: its own name, as a person types it (issue 40 point 5)."""
    return "prohost/" + lane.removeprefix("conv:")


async def test_a_collected_conversation_gets_its_branch_and_commit_back(tmp_path: Path) -> None:
    with trio.fail_after(30):
        source = await make_repo(tmp_path / "app")
        head = (await git(source, "rev-parse", "HEAD")).strip()
        home = tmp_path / "home"
        manager = WorktreeManager(home, [source])
        prepared = await manager.prepare("conv:C1")
        path = only(prepared.checkouts)
        work = await commit_file(path, "a.txt", "turn 1\n")
        await manager.bring_back(prepared)  # what the run's end does

        # Idle for a month: collected, since its commit lives on in its branch.
        entries = await collect_garbage(home, older_than_s=14 * DAY, dry_run=False,
                                        force=False, now=time.time() + 30 * DAY)
        assert [entry.action for entry in entries] == ["removed"]
        assert not path.exists()
        assert (await git(source, "rev-parse", branch_of("conv:C1"))).strip() == work

        # The conversation comes back: its worktree is made again on its branch,
        # with its commit, not afresh from the original's HEAD.
        again = await manager.prepare("conv:C1")
        assert again.failures == () and only(again.checkouts) == path
        assert (await git(path, "symbolic-ref", "--short", "HEAD")).strip() == branch_of("conv:C1")
        assert (await git(path, "rev-parse", "HEAD")).strip() == work
        assert (path / "a.txt").read_text() == "turn 1\n"
        # The original never moved.
        assert (await git(source, "rev-parse", "HEAD")).strip() == head
        assert (await git(source, "symbolic-ref", "--short", "HEAD")).strip() == "main"


async def test_a_worktree_deleted_behind_gits_back_finds_its_branch_again(
    tmp_path: Path,
) -> None:
    with trio.fail_after(30):
        source = await make_repo(tmp_path / "app")
        manager = WorktreeManager(tmp_path / "home", [source])
        path = only((await manager.prepare("conv:C1")).checkouts)
        work = await commit_file(path, "a.txt", "turn 1\n")
        # Its registration still holds the branch ("already checked out"): the
        # prepare prunes it and checks the branch out again.
        shutil.rmtree(path)
        again = await manager.prepare("conv:C1")
        assert again.failures == ()
        assert (await git(only(again.checkouts), "rev-parse", "HEAD")).strip() == work


async def test_a_branch_checked_out_by_the_person_is_not_moved_under_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """The person checked the conversation's branch out in the original: the
    conversation still gets its worktree (in a repository of its own, starting
    from that branch), but its commits are not brought back onto the branch the
    person has checked out (git refuses to move it under their files); the
    harness says so in its log and keeps them in the conversation's repository."""
    with trio.fail_after(30):
        taken = await make_repo(tmp_path / "app")
        branch = branch_of("conv:C1")
        await git(taken, "switch", "-q", "-c", branch)
        mine = (await git(taken, "rev-parse", "HEAD")).strip()
        manager = WorktreeManager(tmp_path / "home", [taken])
        prepared = await manager.prepare("conv:C1")
        assert prepared.failures == ()
        path = only(prepared.checkouts)
        work = await commit_file(path, "a.txt", "turn 1\n")
        await manager.bring_back(prepared)
        assert (await git(taken, "rev-parse", branch)).strip() == mine
        assert (await git(taken, "status", "--porcelain")) == ""
        assert f"could not bring the branch {branch} back" in caplog.text
        assert (await git(path, "rev-parse", "HEAD")).strip() == work


async def test_a_branch_name_git_refuses_is_said_plainly() -> None:
    with trio.fail_after(30):
        # No lane folder name can be one (they are letters, digits, _ and -), but
        # git is the judge: what it refuses is said, not passed to `worktree add`.
        with pytest.raises(GitError, match=r"does not accept 'prohost/a\.\.b' as a branch"):
            await check_branch("prohost/a..b")


async def test_a_detached_worktree_of_an_earlier_version_is_put_on_its_branch(
    tmp_path: Path,
) -> None:
    with trio.fail_after(30):
        source = await make_repo(tmp_path / "app")
        manager = WorktreeManager(tmp_path / "home", [source])
        # What an earlier version made: a detached worktree, with the agent's commit
        # and an uncommitted file in it.
        path = manager.lane_folder("conv:C1") / "app"
        await git(source, "worktree", "add", "--detach", str(path), "HEAD")
        work = await commit_file(path, "a.txt", "turn 1\n")
        (path / "draft.txt").write_text("not yet\n")
        prepared = await manager.prepare("conv:C1")
        assert prepared.checkouts[0].branch == branch_of("conv:C1")
        assert (await git(path, "symbolic-ref", "--short", "HEAD")).strip() == branch_of("conv:C1")
        # Moved to the conversation's own repository first (migrate.py): the
        # person's branch comes with the run's end, as any conversation's does.
        await manager.bring_back(prepared)
        assert (await git(source, "rev-parse", branch_of("conv:C1"))).strip() == work
        assert (path / "draft.txt").read_text() == "not yet\n"


async def test_a_worktree_the_agent_detached_is_left_so_and_said_so(tmp_path: Path) -> None:
    with trio.fail_after(30):
        source = await make_repo(tmp_path / "app")
        manager = WorktreeManager(tmp_path / "home", [source])
        path = only((await manager.prepare("conv:C1")).checkouts)
        await git(path, "switch", "-q", "--detach")
        again = await manager.prepare("conv:C1")
        assert again.checkouts[0].branch is None
        detached = await trio.run_process(["git", "-C", str(path), "symbolic-ref", "-q", "HEAD"],
                                          check=False)
        assert detached.returncode == 1
        prompt = build_prompt(AgentRun(run_id="r", completion_path="/c", text="go"),
                              PromptContext(timeout_s=0, idle_timeout_s=0, parallel=False,
                                            checkouts=again.checkouts))
        assert "      on a detached HEAD (no branch)" in prompt
