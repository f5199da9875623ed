"""What the agent CLI prints is read whatever its text holds, and its version is
asked of the program the user named, as written (issue 20, points 9 and 10).

Through the real harness and reference server, with the fake CLIs of tests/agents:

- a reply ending in half an emoji, which Claude Code's ``JSON.stringify`` writes as
  the escape ``\\ud83d``, or holding a byte that is not UTF-8, is delivered with
  U+FFFD in its place, instead of an internal error or "ended without a result";
- for ``--exec '$HOME/.local/bin/claude -p'`` the version probe (what the status
  message and the panel show) gets the CLI's version: the shell, not the harness,
  expands ``$HOME``.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest
import trio

from prohost.engine.agent.brains import brain_for
from prohost.engine.agent.brains.base import decode_json_line
from prohost.engine.supervisor.upkeep import probe_brain
from prohost.engine.view.status_file import Facts
from tests.kits.harness import AGENTS, finished, running_harness, running_server

REPLIES = {"claude": "Hello from the fake Claude.", "codex": "Fixed: the fixture path was wrong."}
VERSIONS = {"claude": "2.1.29 (Claude Code)", "codex": "codex-cli 0.0.0-fake"}


def install(folder: Path, name: str) -> Path:
    """The fake CLI as a program called ``name`` in ``folder``."""
    program = folder / name
    folder.mkdir(parents=True, exist_ok=True)
    program.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} "
                       f"{shlex.quote(str(AGENTS / f'fake_{name}.py'))} \"$@\"\n")
    program.chmod(0o755)
    return program


@pytest.mark.protocol("§5", "§7")
@pytest.mark.parametrize("scenario", ["lone_surrogate", "bad_byte"])
@pytest.mark.parametrize("cli", ["claude", "codex"])
async def test_a_reply_with_text_that_is_not_unicode_is_delivered_mended(
    tmp_path: Path, cli: str, scenario: str,
) -> None:
    program = install(tmp_path / "bin", cli)
    env = {**os.environ, f"FAKE_{cli.upper()}_SCENARIO": scenario}
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=str(program), env=env,
        ):
            run_id = await server.submit_run("hi", conversation_id="C1")
            await server.wait_until(finished(run_id))
            completion = server.run(run_id).completion or {}
    assert completion["ok"] is True, completion
    assert completion["reply"] == f"{REPLIES[cli]} \ufffd"
    assert completion["session_id"]


@pytest.mark.protocol("§5")
def test_a_whole_escaped_emoji_is_kept() -> None:
    # Only a *lone* surrogate is replaced: an escaped pair is one character.
    event = decode_json_line(b'{"result":"ok \\ud83d\\ude00","lone":"\\uDE00\\ud83d"}')
    assert event == {"result": "ok \U0001F600", "lone": "\ufffd\ufffd"}


@pytest.mark.parametrize("cli", ["claude", "codex"])
async def test_the_version_comes_from_a_program_named_through_home(
    tmp_path: Path, cli: str,
) -> None:
    # The probe the harness runs at start for its status message (§5.7), on the
    # brain `--brain auto` picks for this line, with the agent's environment.
    user_home = tmp_path / "user"
    install(user_home / ".local" / "bin", cli)
    brain = brain_for("auto", f"$HOME/.local/bin/{cli} --model o3")
    assert brain.name == cli
    facts = Facts(on_change=lambda: None)
    with trio.fail_after(30):
        await probe_brain(brain, {**os.environ, "HOME": str(user_home)}, facts,
                          home=tmp_path / "prohost-home")
    assert facts.brain_version == VERSIONS[cli]


#: A CLI that, asked its version, makes its folder as codex 0.171 does (its helper
#: programs go in ``$CODEX_HOME/tmp``, ``~/.codex`` without the variable).
MAKES_ITS_FOLDER = {
    "codex": '#!/bin/sh\nmkdir -p "${CODEX_HOME:-$HOME/.codex}/tmp"\necho 9.9.9\n',
    "claude": '#!/bin/sh\nmkdir -p "${CLAUDE_CONFIG_DIR:-$HOME/.claude}"\necho 9.9.9\n',
}


@pytest.mark.parametrize("cli", ["claude", "codex"])
async def test_asking_the_version_makes_nothing_in_the_person_s_home(
    tmp_path: Path, cli: str,
) -> None:
    user_home = tmp_path / "user"
    user_home.mkdir()
    program = tmp_path / "bin" / cli
    program.parent.mkdir()
    program.write_text(MAKES_ITS_FOLDER[cli])
    program.chmod(0o755)
    brain = brain_for("auto", f"{program} -p")
    assert brain.name == cli
    facts = Facts(on_change=lambda: None)
    env = {key: value for key, value in os.environ.items()
           if key not in ("CODEX_HOME", "CLAUDE_CONFIG_DIR")}
    with trio.fail_after(30):
        await probe_brain(brain, {**env, "HOME": str(user_home)}, facts,
                          home=tmp_path / "prohost-home")
    assert facts.brain_version == "9.9.9"
    assert list(user_home.iterdir()) == []  # no ~/.codex, no ~/.claude
