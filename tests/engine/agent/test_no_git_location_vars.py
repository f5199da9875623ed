"""An agent never inherits the variables that point git at one repository (issue 20, 8).

A harness started from a git hook or an editor's terminal has GIT_DIR, GIT_INDEX_FILE,
GIT_WORK_TREE… in its environment. git's own calls strip them; before this fix the
agent got them, so every git command it ran acted on that other repository. A real
harness, the reference server, and real agent processes: the env_dump fake, and a
plain shell line that asks real git which repository it is in.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import trio

from prohost.engine.repos.gitcmd import GIT_LOCATION_VARS
from tests.kits.harness import agent_command, finished, running_harness, running_server

pytestmark = pytest.mark.protocol("§5")


def _git_init(path: Path) -> Path:
    path.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(path)], check=True, capture_output=True)
    return path


async def test_the_agent_does_not_inherit_git_locating_variables(tmp_path: Path) -> None:
    other = _git_init(tmp_path / "the hook's repo")
    workdir = _git_init(tmp_path / "work")
    env = {
        **os.environ,
        "GIT_DIR": str(other / ".git"),
        "GIT_WORK_TREE": str(other),
        "GIT_INDEX_FILE": str(other / ".git" / "index"),
        "GIT_OBJECT_DIRECTORY": str(other / ".git" / "objects"),
        "GIT_COMMON_DIR": str(other / ".git"),
        "KEEP_ME": "kept",
    }
    replies = {}
    with trio.fail_after(60):
        async with running_server() as server:
            for name, command in (
                ("env", agent_command("env_dump.py")),
                # What the agent would notice: real git, run by the agent, in its workdir.
                ("git", "cat >/dev/null; git rev-parse --absolute-git-dir"),
            ):
                home = tmp_path / f"home-{name}"
                async with running_harness(
                    server, home, exec_command=command, brain="plain", workdir=workdir,
                    env=env,
                ):
                    run_id = await server.submit_run("hello", conversation_id=f"C-{name}")
                    await server.wait_until(finished(run_id))
                completion = server.run(run_id).completion or {}
                assert completion.get("ok") is True, completion
                replies[name] = completion["reply"]

    dumped = json.loads(replies["env"])["env"]
    assert dumped["KEEP_ME"] == "kept"
    leaked = sorted(set(dumped) & GIT_LOCATION_VARS)
    assert not leaked, f"the agent inherited {leaked}"
    assert Path(replies["git"].strip()) == (workdir / ".git").resolve()
