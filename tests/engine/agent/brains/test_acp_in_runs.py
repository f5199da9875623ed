"""The ACP brain through the whole harness and the reference server: a
conversation's turns in one ACP session, its cost share across restarts, the
timeline, and a cancel that reaches the agent as ``session/cancel`` (§5, §6, §8)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from prohost.engine.agent import process
from prohost.engine.view.statustext import brain_line
from prohost.wire.outcomes import STOPPED
from prohost.wire.protocol import Status
from tests.kits.acp import acp_harness, record_of
from tests.kits.harness import finished, messages
from tests.kits.repos import make_readme_repo


def received(tmp_path: Path) -> list[str]:
    lines = record_of(tmp_path).read_text().splitlines()
    return [json.loads(line).get("method") or json.loads(line).get("event") or "response"
            for line in lines]


@pytest.mark.protocol("§5", "§7")
async def test_a_conversation_is_one_acp_session_and_each_turn_pays_its_share(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    completions: list[dict[str, Any]] = []
    with trio.fail_after(60):
        # Two harnesses one after the other on the same home: the session and its
        # running cost survive the restart in the ledger.
        for turn in ("turn 1", "turn 2"):
            async with acp_harness(tmp_path, home=home) as (server, _):
                run_id = await server.submit_run(turn, conversation_id="C1")
                await server.wait_until(finished(run_id))
                completions.append(server.run(run_id).completion or {})
    first, second = completions
    assert first["ok"] and second["ok"], completions
    assert first["reply"] == second["reply"] == "Hello from the fake ACP agent."
    assert first["session_id"] and second["session_id"] == first["session_id"]
    assert [m for m in received(tmp_path) if m.startswith("session/")] == [
        "session/new", "session/prompt", "session/load", "session/prompt"]
    assert first["usage"]["cost_usd"] == second["usage"]["cost_usd"] == 0.25
    assert second["usage"]["input_tokens"] == 100


@pytest.mark.protocol("§8")
async def test_tool_calls_of_an_acp_agent_reach_the_timeline(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with acp_harness(tmp_path, "tools") as (server, _):
            run_id = await server.submit_run("run the tests", conversation_id="C1")
            await server.wait_until(finished(run_id))
            timeline = server.run(run_id).timeline
            assert [(e["name"], e["state"], e["summary"]) for e in timeline] == [
                ("Execute", "calling", "Running pytest -q"),
                ("Execute", "done", "Running pytest -q")]
            completion = server.run(run_id).completion or {}
            assert completion["reply"].endswith("The tool was allowed (once).")


@pytest.mark.protocol("§6")
async def test_a_cancelled_acp_run_asks_the_agent_to_cancel_and_keeps_its_session(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        async with acp_harness(tmp_path, "hang") as (server, _):
            run_id = await server.submit_run("take your time", conversation_id="C1")
            await server.wait_until(lambda state: bool(state.runs[run_id].timeline))
            await server.cancel_run(run_id, "the user changed their mind")
            await server.wait_until(
                lambda state: state.runs[run_id].completion is not None)
            completion = server.run(run_id).completion or {}
            assert completion["ok"] is False
            assert completion["error"] == "cancelled: the user changed their mind"
            assert completion["session_id"].startswith("sess_")
            assert received(tmp_path)[-2:] == ["session/cancel", "eof"]


async def test_an_agent_that_stays_after_its_answer_is_stopped_and_the_run_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(process, "LINGER_S", 0.5)
    with trio.fail_after(60):
        async with acp_harness(tmp_path, FAKE_ACP_LINGER="1") as (server, _):
            run_id = await server.submit_run("hello", conversation_id="C1")
            await server.wait_until(finished(run_id))
            completion = server.run(run_id).completion or {}
            assert completion["ok"] is True, completion
            assert completion["reply"] == "Hello from the fake ACP agent."


@pytest.mark.protocol("§9")
async def test_the_second_signal_asks_the_acp_agent_to_cancel_within_the_stop_window(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        async with acp_harness(tmp_path, "hang") as (server, running):
            run_id = await server.submit_run("take your time", conversation_id="C1")
            await server.wait_until(lambda state: bool(state.runs[run_id].timeline))
            stopped_at = trio.current_time()
            running.harness.stop()
            await server.wait_until(
                lambda state: state.runs[run_id].completion is not None)
            assert trio.current_time() - stopped_at < 5  # §9's window
            completion = server.run(run_id).completion or {}
            assert completion["error"] == STOPPED
            assert completion["session_id"].startswith("sess_")
            assert received(tmp_path)[-2:] == ["session/cancel", "eof"]


@pytest.mark.protocol("§5")
async def test_a_runs_mcp_server_reaches_an_acp_agent_in_its_session(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with acp_harness(tmp_path) as (server, _):
            run_id = await server.submit_run(
                "use the tools", conversation_id="C1",
                mcp={"url": "http://127.0.0.1:9/mcp", "token": "t0k3n"})
            await server.wait_until(finished(run_id))
            assert (server.run(run_id).completion or {}).get("ok")
    lines = record_of(tmp_path).read_text().splitlines()
    setup = next(json.loads(line) for line in lines if "session/new" in line)
    assert setup["params"]["mcpServers"] == [
        {"type": "http", "name": "prohost", "url": "http://127.0.0.1:9/mcp",
         "headers": [{"name": "Authorization", "value": "Bearer t0k3n"}]}]


@pytest.mark.protocol("§5")
async def test_with_repos_the_acp_session_works_in_the_conversations_worktree(
    tmp_path: Path,
) -> None:
    source = await make_readme_repo(tmp_path / "code" / "app")
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with acp_harness(tmp_path, home=home, repos=(source,)) as (server, _):
            run_id = await server.submit_run("hello", conversation_id="C1")
            await server.wait_until(finished(run_id))
            assert (server.run(run_id).completion or {}).get("ok")
    lines = record_of(tmp_path).read_text().splitlines()
    setup = next(json.loads(line) for line in lines if "session/new" in line)
    # The session's cwd is where the agent starts (§5.3), not --workdir.
    cwd = Path(setup["params"]["cwd"])
    assert cwd.name == "app" and str(cwd).startswith(str(home / "worktrees"))


@pytest.mark.protocol("§2", "§5")
async def test_the_model_and_mode_given_to_the_session_show_in_status(tmp_path: Path) -> None:
    """In ``agent status`` and in the §2 ``status`` message the server gets."""
    with trio.fail_after(60):
        async with acp_harness(tmp_path, acp_model=(("", "fake-model-2"),),
                               acp_mode=(("", "plan"),)) as (server, running):
            run_id = await server.submit_run("hello", conversation_id="C1")
            await server.wait_until(finished(run_id))
            completion = server.run(run_id).completion or {}
            assert completion["ok"] and completion["usage"]["model"] == "fake-model-2"
            line = brain_line(running.harness.snapshot())
            assert line == "acp · fake-model-2 · mode plan", line
            await server.wait_until(lambda s: any(m.mode for m in messages(s, Status)))
            status = [m for m in messages(server.state, Status) if m.mode][-1]
            assert (status.brain, status.model, status.mode) == ("acp", "fake-model-2", "plan")
    assert "session/set_mode" in received(tmp_path)
