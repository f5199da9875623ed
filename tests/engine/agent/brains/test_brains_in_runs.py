"""Brains through the whole harness: sessions per lane, the fresh retry, the
timeline, MCP, the agent's environment and the status message (§5, §8)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from prohost.engine.accounts.book import DEFAULT_ACCOUNT
from prohost.engine.run.heldrun import HeldRun, Phase
from prohost.wire.protocol import RunBeat, Status
from prohost.wire.runs import parse_body
from tests.kits.fake_clis import (
    FAKE_CLAUDE,
    Turnstile,
    claude_env,
    invocations,
    resumed,
    seed_session,
)
from tests.kits.harness import (
    AGENTS,
    finished,
    messages,
    released,
    running_harness,
    running_server,
    wall_clock_bound,
)
from tests.kits.paths import logs_folder


@pytest.mark.protocol("§4", "§5")
async def test_a_lane_resumes_its_own_session_and_no_other(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=FAKE_CLAUDE, brain="claude",
            env=claude_env(tmp_path),
        ):
            first = await server.submit_run("turn 1", conversation_id="C1")
            await server.wait_until(finished(first))
            second = await server.submit_run("turn 2", conversation_id="C1")
            await server.wait_until(finished(second))
            other = await server.submit_run("another thread", conversation_id="C2")
            await server.wait_until(finished(other))
            completions = [server.run(r).completion or {} for r in (first, second, other)]
            assert all(c.get("ok") for c in completions)
            session = completions[0]["session_id"]
            assert session and completions[1]["session_id"] == session
            assert completions[2]["session_id"] != session
            assert [resumed(i) for i in invocations(tmp_path)] == [None, session, None]
            assert completions[0]["reply"] == "Hello from the fake Claude."
            assert completions[0]["usage"]["output_tokens"] >= 0
            assert "cost_usd" in completions[0]["usage"]
            assert isinstance(completions[0]["duration_ms"], int)


@pytest.mark.protocol("§5")
async def test_a_rejected_session_is_retried_once_fresh_and_forgotten(tmp_path: Path) -> None:
    home = tmp_path / "home"
    seed_session(home, "conv:C1", "stale-session")
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, home, exec_command=FAKE_CLAUDE, brain="claude",
            env=claude_env(tmp_path, "no_session"),
        ) as running:
            run_id = await server.submit_run("hello again", conversation_id="C1")
            await server.wait_until(finished(run_id))
            completion = server.run(run_id).completion or {}
            assert completion["ok"] is True
            fresh = completion["session_id"]
            assert fresh and fresh != "stale-session"
            assert [resumed(i) for i in invocations(tmp_path)] == ["stale-session", None]
            await released(running.harness, run_id)
            assert running.ledger is not None
            assert running.ledger.account_session("conv:C1", DEFAULT_ACCOUNT) == fresh


@pytest.mark.protocol("§5")
async def test_the_fresh_retry_shares_the_runs_deadline(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    # trio's clock stands still unless the test moves it, so the test alone decides
    # how much of the 10 s budget each attempt uses; both attempts wait for the
    # test's word. Should something hang, the wall-clock bound ends the test (on the
    # still clock, fail_after would never fire, and the harness's own short timers
    # keep an autojump from ever reaching it).
    home = tmp_path / "home"
    seed_session(home, "conv:C1", "stale-session")
    turnstile = Turnstile()
    async with wall_clock_bound(120), trio.open_nursery() as nursery:
        await nursery.start(turnstile.serve)
        async with running_server() as server, running_harness(
            server, home, exec_command=FAKE_CLAUDE, brain="claude", timeout_s=10,
            env=claude_env(tmp_path, "no_session", FAKE_CLAUDE_GATE=str(turnstile.port)),
        ):
            run_id = await server.submit_run("hello again", conversation_id="C1")
            resuming = await turnstile.next()
            mock_clock.jump(6)
            await resuming.send_all(b"go\n")  # "No conversation found": retry fresh
            fresh = await turnstile.next()
            # 11 s into the run, 5 s into the retry: over the run's budget, well
            # inside a fresh one. Once everything has reacted, the retry must
            # have been stopped, so the go below comes too late to matter.
            mock_clock.jump(5)
            await trio.testing.wait_all_tasks_blocked()
            with contextlib.suppress(trio.BrokenResourceError):
                await fresh.send_all(b"go\n")
            await server.wait_until(finished(run_id))
            completion = server.run(run_id).completion or {}
            assert completion["ok"] is False, completion
            assert "10-second limit (--timeout)" in completion["error"]
            assert [resumed(i) for i in invocations(tmp_path)] == ["stale-session", None]
        nursery.cancel_scope.cancel()


@pytest.mark.protocol("§8")
async def test_tool_calls_reach_the_timeline_before_the_completion(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=FAKE_CLAUDE, brain="claude",
            env=claude_env(tmp_path, "tool"),
        ):
            run_id = await server.submit_run("run the tests", conversation_id="C1")
            seen_at_completion: list[int] = []

            def done(state: Any) -> bool:
                record = state.runs[run_id]
                if record.completion is not None and not seen_at_completion:
                    seen_at_completion.append(len(record.timeline))
                return record.completion is not None

            await server.wait_until(done)
            timeline = server.run(run_id).timeline
            assert [(e["name"], e["state"]) for e in timeline] == [
                ("Bash", "calling"), ("Bash", "done")]
            assert timeline[0]["id"] == timeline[1]["id"]
            assert timeline[0]["summary"] == timeline[1]["summary"] != ""
            assert seen_at_completion == [2]


async def test_a_run_whose_mcp_cannot_be_prepared_never_starts_the_agent(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=FAKE_CLAUDE, brain="claude",
            env=claude_env(tmp_path),
        ):
            run_id = await server.submit_run(
                "use the tools", conversation_id="C1",
                mcp={"url": "ftp://not-http.example/mcp", "token": "t0k3n"})
            await server.wait_until(finished(run_id))
            completion = server.run(run_id).completion or {}
            assert completion["ok"] is False
            assert "MCP" in completion["error"]
            assert "t0k3n" not in completion["error"]
            assert not (logs_folder(tmp_path) / "record.json").exists()  # never spawned


async def test_mcp_config_is_private_and_removed_after_the_run(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, home, exec_command=FAKE_CLAUDE, brain="claude", env=claude_env(tmp_path),
        ):
            run_id = await server.submit_run(
                "use the tools", conversation_id="C1",
                mcp={"url": "https://mcp.example/mcp", "token": "t0k3n"})
            await server.wait_until(finished(run_id))
            assert (server.run(run_id).completion or {}).get("ok") is True
            [seen] = invocations(tmp_path)
            # The agent got its MCP server and token, in a file only this user reads.
            server_config = seen["mcp_config"]["mcpServers"]["prohost"]
            assert server_config["headers"]["Authorization"] == "Bearer t0k3n"
            assert seen["mcp_config_mode"] == 0o600
            # Removed after the run, with the run's folder it was in (named by a
            # digest of the run id, not the id: issue 37 point 11).
            config = Path(seen["mcp_config_path"])
            assert (home / "runs") in config.parents
            assert not await trio.Path(config).exists()
            run_folder = home / "runs" / config.relative_to(home / "runs").parts[0]
            assert not await trio.Path(run_folder).exists()


@pytest.mark.protocol("§5")
async def test_the_agent_environment(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=FAKE_CLAUDE, brain="claude",
            env=claude_env(tmp_path, CLAUDECODE="1"),
        ):
            run_id = await server.submit_run("hi", conversation_id="C1")
            await server.wait_until(finished(run_id))
            [seen] = invocations(tmp_path)
            assert seen["env"]["PROHOST_RUN_ID"] == run_id
            assert seen["env"]["PROHOST_PAIRED_RUN"] == "1"
            assert seen["claudecode_set"] is False


@pytest.mark.protocol("§2")
async def test_status_names_the_brain_its_version_and_model(tmp_path: Path) -> None:
    # A program really called `claude`, so `--brain auto` and `claude --version` see it.
    program = tmp_path / "bin" / "claude"
    program.parent.mkdir()
    program.write_text(f"#!/bin/sh\nexec {FAKE_CLAUDE} \"$@\"\n")
    program.chmod(0o755)
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=f"{program} -p --model opus",
            env=claude_env(tmp_path),
        ):
            await server.wait_until(lambda s: any(
                m.brain_version for m in messages(s, Status)))
            status = [m for m in messages(server.state, Status) if m.brain_version][-1]
            assert status.brain == "claude"
            assert status.brain_version == "2.1.29 (Claude Code)"
            assert status.model == "opus"
            assert "timeline" in status.features


@pytest.mark.protocol("§2")
def test_a_running_runs_heartbeat_entry_carries_its_activity() -> None:
    held = HeldRun.of(parse_body(json.dumps(
        {"run_id": "r1", "completion_path": "/v1/x", "text": "", "conversation_id": "C"})))
    held.progress.activity = "Bash: pytest -q"
    assert held.beat().activity is None  # queued: nothing is happening yet
    held.move_to(Phase.RUNNING, lambda: None)
    assert held.beat() == RunBeat(run_id="r1", state="running", lane="conv:C",
                                  activity="Bash: pytest -q")


@pytest.mark.protocol("§5")
async def test_codex_threads_are_resumed_per_lane(tmp_path: Path) -> None:
    fake = AGENTS / "fake_codex.py"
    program = tmp_path / "bin" / "codex"
    program.parent.mkdir()
    program.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(fake))}"
                       ' "$@"\n')
    program.chmod(0o755)
    env = {**os.environ, "FAKE_CODEX_SCENARIO": "tool",
           "FAKE_CODEX_RECORD": str(logs_folder(tmp_path) / "record.json")}
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=str(program), env=env,
        ):
            first = await server.submit_run("turn 1", conversation_id="C1")
            await server.wait_until(finished(first))
            second = await server.submit_run("turn 2", conversation_id="C1")
            await server.wait_until(finished(second))
            one, two = (server.run(r).completion or {} for r in (first, second))
            assert one["ok"] and two["ok"]
            assert one["reply"] and one["session_id"]
            argvs = [i["argv"] for i in invocations(tmp_path)]
            assert argvs[0][0] == "exec" and "resume" not in argvs[0]
            assert argvs[1][argvs[1].index("resume") + 1] == one["session_id"]
            assert [e["name"] for e in server.run(first).timeline] == ["Bash", "Bash"]
