"""A conversation keeps its agent session through a turn that never started one.

A brain reads "non-zero exit before the CLI announced a session" as a rejected
resume and the run is tried again fresh; a CLI that cannot start at all (missing
after an upgrade, refusing a flag) fails that retry the same way. Such a turn must
report its failure and leave the lane's session alone, so that the next good turn
resumes the conversation instead of starting a new one with no memory. Everything
here is real: the reference server, the harness, the ledger file, the fake CLIs
(tests/agents/fake_claude.py, fake_codex.py) as programs named ``claude`` /
``codex`` on disk.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from prohost.engine.accounts.book import DEFAULT_ACCOUNT
from prohost.engine.agent.brains.claude import ClaudeBrain
from prohost.engine.agent.process import ProcessGroups
from prohost.engine.run.execute import ExecSpec
from prohost.wire.runs import AgentRun
from tests.kits.fake_clis import CLAUDE, CODEX, Cli, Turnstile, install, seed_session, turn
from tests.kits.harness import Running, finished, released, running_harness, running_server
from tests.kits.paths import logs_folder
from tests.kits.runner import solo_runner

pytestmark = pytest.mark.protocol("§5")


def invocations(tmp_path: Path) -> list[dict[str, Any]]:
    path = logs_folder(tmp_path) / "record.json"
    found: list[dict[str, Any]] = json.loads(path.read_text()) if path.exists() else []
    return found


def saved_session(running: Running) -> str | None:
    assert running.ledger is not None
    return running.ledger.account_session("conv:C1", DEFAULT_ACCOUNT)


@pytest.mark.parametrize("breakage", ["missing", "refused"])
@pytest.mark.parametrize("cli", [CLAUDE, CODEX], ids=lambda cli: cli.name)
async def test_a_turn_the_cli_cannot_start_keeps_the_conversations_session(
    tmp_path: Path, cli: Cli, breakage: str,
) -> None:
    program = install(tmp_path, cli)
    refuse = tmp_path / "refuse"
    codex_home = tmp_path / "codex-home"  # where the fake codex keeps its threads
    codex_home.mkdir()
    env = {**os.environ, cli.record: str(logs_folder(tmp_path) / "record.json"),
           cli.refuse: str(refuse),
           "CODEX_HOME": str(codex_home)}
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=str(program), env=env,
        ) as running:
            one = await turn(running, "turn 1")
            assert one["ok"] is True, one
            session = one["session_id"]
            assert session and saved_session(running) == session

            # The CLI cannot start for one turn: gone mid-upgrade, or refusing a
            # flag the harness passes.
            if breakage == "missing":
                program.rename(program.with_name("moved-away"))
            else:
                refuse.write_text(cli.refused_flag)
            two = await turn(running, "turn 2")
            assert two["ok"] is False
            if breakage == "missing":
                assert "status 127" in two["error"] and "not found" in two["error"], two
            elif cli is CLAUDE:
                assert two["error"] == ("the agent exited with status 1: error: unknown "
                                        f"option '{cli.refused_flag}'")
            else:
                assert "the agent exited with status 2" in two["error"], two
            assert two["session_id"] == session
            assert saved_session(running) == session

            if breakage == "missing":
                program.with_name("moved-away").rename(program)
            else:
                refuse.unlink()
            three = await turn(running, "turn 3")
            assert three["ok"] is True, three
            assert three["session_id"] == session
            assert saved_session(running) == session

    resumed = [cli.resumed(entry["argv"]) for entry in invocations(tmp_path)]
    if breakage == "missing":
        # Turn 2 never reached the CLI; turn 3 resumed the conversation.
        assert resumed == [None, session]
    else:
        # Turn 2 tried the session, then a fresh one (both refused); turn 3 resumed.
        assert resumed == [None, session, None, session]


async def test_a_codex_thread_it_no_longer_has_is_replaced_by_a_fresh_one(
    tmp_path: Path,
) -> None:
    # A real rejection: codex has no rollout for the thread (its resume error, exit
    # 1 before thread.started), and a fresh thread works. The new one is saved.
    program = install(tmp_path, CODEX)
    codex_home = tmp_path / "codex-home"
    codex_home.mkdir()
    home = tmp_path / "home"
    seed_session(home, "conv:C1", "0199a213-0000-7000-8000-000000000000")
    env = {**os.environ, CODEX.record: str(logs_folder(tmp_path) / "record.json"),
           "CODEX_HOME": str(codex_home)}
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, home, exec_command=str(program), env=env,
        ) as running:
            completion = await turn(running, "hello again")
            assert completion["ok"] is True, completion
            fresh = completion["session_id"]
            assert fresh and fresh != "0199a213-0000-7000-8000-000000000000"
            assert saved_session(running) == fresh
            again = await turn(running, "and again")
            assert again["ok"] is True and again["session_id"] == fresh
    assert [CODEX.resumed(entry["argv"]) for entry in invocations(tmp_path)] == [
        "0199a213-0000-7000-8000-000000000000", None, fresh]


async def test_an_agent_that_cannot_be_spawned_keeps_the_session(tmp_path: Path) -> None:
    # exec(2) itself fails (E2BIG: an environment too big, which stops root too;
    # EAGAIN from a full process table ends the same way): no process ever existed.
    env = {**os.environ, "PROHOST_TEST_BALLAST": "x" * (4 * 1024 * 1024)}
    program = install(tmp_path, CLAUDE)
    spec = ExecSpec(command=str(program), workdir=tmp_path / "work", timeout_s=0,
                    idle_timeout_s=0, parallel=False, secrets=())
    run = AgentRun(run_id="run_spawn_1", completion_path="/c", text="hello", author="dana")
    groups = ProcessGroups()
    with trio.fail_after(30):
        async with solo_runner(tmp_path / "solo", spec, ClaudeBrain(str(program)),
                               groups=groups, env=env) as solo:
            outcome = await solo.outcome(run, session_id="kept-session")
    assert outcome.ok is False
    assert outcome.error is not None
    assert outcome.error.startswith(
        "could not start the agent in the working directory (--workdir): ")
    assert outcome.session_id == "kept-session"
    assert len(groups) == 0


@pytest.mark.protocol("§6")
async def test_a_run_cancelled_before_its_fresh_session_started_keeps_the_session(
    tmp_path: Path,
) -> None:
    # The CLI refuses the resume, the fresh attempt is still starting (held by the
    # test before it prints anything) when the sender cancels: no new session
    # exists, so the lane keeps the one it had.
    home = tmp_path / "home"
    seed_session(home, "conv:C1", "old-session")
    turnstile = Turnstile()
    env = {**os.environ, "FAKE_CLAUDE_SCENARIO": "no_session",
           "FAKE_CLAUDE_RECORD": str(logs_folder(tmp_path) / "record.json")}
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(turnstile.serve)
            env["FAKE_CLAUDE_GATE"] = str(turnstile.port)
            async with running_server() as server, running_harness(
                server, home, exec_command=str(install(tmp_path, CLAUDE)), env=env,
            ) as running:
                run_id = await server.submit_run("hello again", conversation_id="C1")
                resuming = await turnstile.next()
                await resuming.send_all(b"go\n")  # "No conversation found"
                await turnstile.next()  # the fresh attempt, held
                await server.cancel_run(run_id, "never mind")
                await server.wait_until(finished(run_id))
                await released(running.harness, run_id)
                completion = server.run(run_id).completion or {}
                assert completion["error"] == "cancelled: never mind"
                assert completion["session_id"] == "old-session"
                assert saved_session(running) == "old-session"
            nursery.cancel_scope.cancel()
    assert [CLAUDE.resumed(entry["argv"]) for entry in invocations(tmp_path)] == [
        "old-session", None]
