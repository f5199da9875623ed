"""A run sent without a conversation keeps its branch only if it committed
something (issue 40, point 5): every such run used to leave a worktree and a branch
(``prohost/run-run_c35c…-cf92…``) for 14 days. The whole harness with ``--repos``,
the reference server, real git, a plain agent that commits, leaves a draft or does
nothing, as its message says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from prohost.engine.repos.lanenames import NAMES_FILE
from tests.kits.harness import finished, running_harness, running_server
from tests.kits.repos import git, make_repo

pytestmark = [pytest.mark.usefixtures("isolated_git"), pytest.mark.protocol("§5", "§7")]

#: Commits when asked to, leaves an uncommitted file when asked to, else nothing.
AGENT = (
    "prompt=$(cat); "
    "case \"$prompt\" in *commit-please*) echo work > agent.txt && git add agent.txt && "
    "git -c user.name=agent -c user.email=agent@example.invalid -c commit.gpgsign=false "
    "commit -q -m \"from $PROHOST_RUN_ID\";; "
    "*draft-please*) echo draft > draft.txt;; esac; echo done"
)


async def branches(source: Path) -> set[str]:
    listed = await git(source, "branch", "--list", "prohost/*", "--format=%(refname:short)")
    return set(listed.split())


async def test_only_a_run_that_committed_keeps_its_branch(tmp_path: Path) -> None:
    source = await make_repo(tmp_path / "app")
    home = tmp_path / "home"
    worktrees = home / "worktrees"
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, home, exec_command=AGENT, brain="plain", repos=(source,),
        ):
            idle = await server.submit_run("just look")
            committed = await server.submit_run("commit-please")
            drafted = await server.submit_run("draft-please")
            talk = await server.submit_run("just look", conversation_id="alpha")
            await server.wait_until(finished(idle, committed, drafted, talk))
    for run_id in (idle, committed, drafted, talk):
        completion = server.run(run_id).completion
        assert completion is not None and completion["ok"], completion
    # Reported as it was, though its worktree is gone now.
    (change,) = server.run(idle).completion["changes"]  # type: ignore[index]
    assert change["commits"] == 0 and change["files"] == []

    # The run that changed nothing: no folder, no branch, no name kept.
    assert not (worktrees / idle).exists()
    assert f"prohost/{idle}" not in await branches(source)
    assert idle not in json.loads((home / NAMES_FILE).read_text())["lanes"].values()
    # The one that committed: its branch, named by its run id, holds its commit.
    assert await git(source, "log", "-1", "--format=%s", f"prohost/{committed}") \
        == f"from {committed}\n"
    # The one that left a draft keeps its worktree (its work is nowhere else), and
    # no branch: it committed nothing.
    assert (worktrees / drafted / "app" / "draft.txt").read_text() == "draft\n"
    # A conversation keeps its worktree and branch for its next turn, named by it.
    assert (worktrees / "alpha" / "app").is_dir()
    assert await branches(source) == {f"prohost/{committed}", "prohost/alpha"}
    assert sorted(p.name for p in worktrees.iterdir()) == sorted([committed, drafted, "alpha"])
