"""The harness's start line says where runs work (issue 40, point 6): with
``--repos``, each run's agent starts in its conversation's worktree, and the line
said "with 'cat' in …/workspace" all the same. A real harness process whose agent
is ``pwd`` (its reply is where it started), on a home paired with the reference
server (port 0), with and without ``--repos`` on a real git checkout."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.kits.harness import finished
from tests.kits.process import harness_process, paired_with_gate
from tests.kits.repos import isolate_git, make_repo


async def start_line_and_reply(tmp_path: Path, *flags: str) -> tuple[str, str]:
    """The harness's start line, and the reply of one run of conversation C1."""
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with paired_with_gate(home) as (_gate, server), \
                harness_process(server, home, "pwd", extra_args=flags) as harness:
            run_id = await server.submit_run("where are you?", conversation_id="C1")
            await server.wait_until(finished(run_id))
            reply = server.run(run_id).reply
    line = next(line for line in harness.log if "run(s) at once with 'pwd'" in line)
    assert reply is not None
    return line, reply.strip()


async def test_with_repos_it_names_the_conversation_s_worktree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    isolate_git(tmp_path, monkeypatch)
    repo = await make_repo(tmp_path / "app")
    line, reply = await start_line_and_reply(tmp_path, "--repos", str(repo))
    assert "workspace" not in line
    worktrees = tmp_path / "home" / "worktrees"
    assert f"each run in its conversation's own worktree of {repo} " \
           f"({worktrees}/<conversation>/app)" in line
    # Where the run did start: that pattern, filled in with its conversation's folder.
    started = Path(reply)
    assert started.parent.parent == worktrees and started.name == "app", reply


async def test_without_repos_it_names_the_workdir(tmp_path: Path) -> None:
    line, reply = await start_line_and_reply(tmp_path)
    workdir = tmp_path / "home" / "workspace"
    assert line.endswith(f"with 'pwd' in {workdir}")
    assert Path(reply) == workdir

