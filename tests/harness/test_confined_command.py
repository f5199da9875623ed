"""The agent the person named starts confined, wherever it is kept (docs/protocol.md
§13): the view empties ``/tmp`` and ``/run`` (the person's sockets live there), so
the files the ``--exec`` line names are shown again, read-only, and only those
(never one inside a hidden place)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from prohost.engine.run.confine import RunPlaces, Sandbox, command_paths, policy_for
from prohost.engine.sandbox import bwrap, confined_command, probe
from tests.kits.harness import finished, running_harness, running_server
from tests.kits.paths import AGENTS

pytestmark = pytest.mark.protocol("§13")


@pytest.fixture
def tools_in_tmp() -> Iterator[Path]:
    """A folder of its own directly in ``/tmp`` (not the test's tmp_path, whose top
    folder holds the run's places and so is shown to the run anyway)."""
    folder = Path(tempfile.mkdtemp(prefix="prohost-tools-", dir="/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def test_an_agent_kept_in_tmp_starts_and_the_rest_of_tmp_stays_unseen(
    tmp_path: Path, tools_in_tmp: Path,
) -> None:
    agent = tools_in_tmp / "agent.py"
    shutil.copy(AGENTS / "reply.py", agent)
    beside = Path(tempfile.mkdtemp(prefix="prohost-other-", dir="/tmp"))
    try:
        (beside / "note.txt").write_text("the person's\n")
        command = shlex.join([sys.executable, str(agent), "--stderr", "x", "hello"])
        # The other folder is named through the environment, not the command line
        # (whose absolute words are the person's choice, shown to the run).
        probe = f'{command} && cat "$PROHOST_TEST_NOTE"'
        env = {"PROHOST_TEST_NOTE": str(beside / "note.txt")}
        with trio.fail_after(60):
            async with running_server() as server, running_harness(
                server, tmp_path / "home", exec_command=probe, env=env,
            ):
                run_id = await server.submit_run("hi", conversation_id="C1")
                await server.wait_until(finished(run_id))
                completion = server.run(run_id).completion
    finally:
        shutil.rmtree(beside, ignore_errors=True)
    assert completion is not None
    # The agent in /tmp started and replied; the other folder of /tmp was not there
    # (cat failed, so the shell's status is cat's: the run failed saying so).
    assert completion["ok"] is False, completion
    assert "note.txt: No such file or directory" in completion["error"], completion
    assert "agent.py" not in completion["error"], completion
    assert completion.get("confined") is True


def test_the_command_s_files_are_found_on_path_and_as_absolute_words(tmp_path: Path) -> None:
    tool = tmp_path / "bin" / "my-agent"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    script = tmp_path / "run.py"
    script.write_text("")
    found = command_paths(f"my-agent --flag {script} /nonexistent/x",
                          {"PATH": str(tool.parent)})
    assert tool in found and script in found
    assert Path("/nonexistent/x") not in found


@pytest.mark.skipif(bwrap.find() is None, reason="no bubblewrap here")
def test_a_command_word_inside_a_hidden_place_stays_hidden(tmp_path: Path) -> None:
    """An ``--exec`` line that names a secret store's file (directly, or through a
    link that leads there) does not uncover it: the run's ``cat`` of it fails,
    while the line's other file is read."""
    user_home = tmp_path / "home"
    (user_home / ".ssh").mkdir(parents=True)
    secret = user_home / ".ssh" / "id_ed25519"
    secret.write_text("the person's key\n")
    (tmp_path / "key-link").symlink_to(secret)
    shown = tmp_path / "shown.txt"
    shown.write_text("shown\n")
    line = f"cat {secret} {tmp_path / 'key-link'} {shown}"
    sandbox = Sandbox(mode="auto", support=probe(), home=tmp_path / "prohost",
                      user_home=user_home, command=command_paths(line, {"PATH": "/usr/bin:/bin"}))
    scratch = sandbox.home / "runs" / "r"
    scratch.mkdir(parents=True)
    places = RunPlaces(workdir=tmp_path / "work", worktrees=(), lane_folder=None,
                       scratch=scratch, brain="plain", env={})
    (tmp_path / "work").mkdir()
    argv = confined_command(policy_for(sandbox, places), ["/bin/sh", "-c", line])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert "the person's key" not in done.stdout, done.stdout
    assert "shown" in done.stdout, done.stderr
