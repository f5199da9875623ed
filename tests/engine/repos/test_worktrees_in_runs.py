"""--repos through the whole harness: each conversation in its own worktrees (§5.1)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import trio

from tests.kits.harness import agent_command, finished, running_harness, running_server
from tests.kits.repos import make_readme_repo


def reply_of(server: object, run_id: str) -> dict[str, object]:
    record = server.run(run_id)  # type: ignore[attr-defined]
    assert record.completion is not None and record.completion["ok"], record.completion
    result: dict[str, object] = json.loads(record.completion["reply"])
    return result


@pytest.mark.protocol("§5")
async def test_each_conversation_works_in_its_own_persistent_checkout(tmp_path: Path) -> None:
    source = await make_readme_repo(tmp_path / "code" / "app")
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, home, exec_command=agent_command("repo_agent.py"), concurrency=2,
            repos=(source,),
        ):
            first = await server.submit_run("turn 1", conversation_id="C1")
            other = await server.submit_run("elsewhere", conversation_id="C2")
            await server.wait_until(finished(first, other))
            second = await server.submit_run("turn 2", conversation_id="C1")
            await server.wait_until(finished(second))
            one, two, three = (reply_of(server, r) for r in (first, other, second))
            # Private folders under the home, one per conversation.
            assert one["folder"] != two["folder"]
            assert one["folder"] == three["folder"]
            assert str(one["folder"]).startswith(str(home / "worktrees"))
            assert one["seen"] == {"app": ["README.md"]}
            # The second turn finds the first turn's uncommitted file; C2 never does.
            assert three["seen"] == {"app": ["README.md", f"note-{first}.txt"]}
            assert two["seen"] == {"app": ["README.md"]}
    # The original checkout was never touched.
    status = await trio.run_process(["git", "-C", str(source), "status", "--porcelain"],
                                    capture_stdout=True)
    assert status.stdout == b""


@pytest.mark.protocol("§5")
async def test_a_missing_checkout_is_read_only_and_the_run_goes_on(tmp_path: Path) -> None:
    source = await make_readme_repo(tmp_path / "code" / "app")
    not_a_repo = tmp_path / "code" / "docs"
    not_a_repo.mkdir()
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=agent_command("repo_agent.py"),
            repos=(source, not_a_repo),
        ):
            run_id = await server.submit_run("work", conversation_id="C1")
            await server.wait_until(finished(run_id))
            reply = reply_of(server, run_id)
            assert reply["read_only_told"] is True
            assert reply["seen"] == {"app": ["README.md"]}


async def test_a_dry_run_writes_nothing(tmp_path: Path) -> None:
    source = await make_readme_repo(tmp_path / "code" / "app")
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, home, exec_command=agent_command("repo_agent.py"), repos=(source,),
            dry_run=True,
        ) as running:
            before = sorted(os.listdir(home))  # the test's own credentials only
            run_id = await server.submit_run("work", conversation_id="C1")
            await server.wait_until(lambda s: s.runs[run_id].state == "accepted")
            await trio.testing.wait_all_tasks_blocked()
            assert sorted(os.listdir(home)) == before == ["credentials.json"]
            assert not running.harness.held
            assert server.run(run_id).completion_posts == 0


async def test_parallel_runs_without_repos_are_warned_about_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="prohost")
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command="true", concurrency=3,
        ):
            pass
    lines = [r.getMessage() for r in caplog.records if "share every checkout" in r.getMessage()]
    assert len(lines) == 1


#: A plain agent that works where it is put: it says where that is and commits a file.
COMMITTING_AGENT = (
    "pwd && echo \"$PROHOST_RUN_ID\" > agent.txt && git add agent.txt && "
    "git -c user.name=agent -c user.email=agent@example.invalid -c commit.gpgsign=false "
    "commit -q -m \"from $PROHOST_RUN_ID\""
)


async def git_out(path: Path, *args: str) -> str:
    done = await trio.run_process(["git", "-C", str(path), *args], capture_stdout=True)
    return done.stdout.decode().strip()


@pytest.mark.protocol("§5")
async def test_a_plain_agent_works_and_commits_in_its_conversations_branch(
    tmp_path: Path,
) -> None:
    source = await make_readme_repo(tmp_path / "code" / "app")
    lib = await make_readme_repo(tmp_path / "code" / "lib")
    head = await git_out(source, "rev-parse", "HEAD")
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, home, exec_command=COMMITTING_AGENT, repos=(source, lib),
            workdir=tmp_path / "workspace",
        ):
            first = await server.submit_run("work", conversation_id="C1")
            other = await server.submit_run("work", conversation_id="C2")
            await server.wait_until(finished(first, other))
            completions = [server.run(r).completion for r in (first, other)]
    worktrees = home / "worktrees"
    for run_id, completion in zip((first, other), completions, strict=True):
        assert completion is not None and completion["ok"], completion
        # It started in its conversation's worktree of the first checkout, not --workdir.
        where = Path(await trio.Path(completion["reply"]).resolve())
        assert where.name == "app" and where.parent.parent == worktrees.resolve()
        # Its commit is on its own branch, in the original repository's refs.
        branch = f"prohost/{where.parent.name}"
        assert await git_out(source, "log", "-1", "--format=%s", branch) == f"from {run_id}"
        assert await git_out(source, "rev-parse", f"{branch}^") == head
        (app,) = [c for c in completion["changes"] if c["repo"] == "app"]
        assert app["branch"] == branch and app["commits"] == 1
    # Two conversations, two branches.
    assert len(os.listdir(worktrees)) == 2
    assert len((await git_out(source, "branch", "--list", "prohost/*")).splitlines()) == 2
    # The original checkout: same commit, same branch, nothing changed.
    assert await git_out(source, "rev-parse", "HEAD") == head
    assert await git_out(source, "symbolic-ref", "--short", "HEAD") == "main"
    assert await git_out(source, "status", "--porcelain") == ""
    assert not (tmp_path / "workspace" / "agent.txt").exists()
