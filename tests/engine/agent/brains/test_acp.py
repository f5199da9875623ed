"""The ACP brain against a fake agent speaking ACP v1 (tests/agents/fake_acp.py),
through the real spawn (:func:`prohost.engine.agent.process.run_agent`): the
conversation, sessions, the reply, stop reasons, permissions, tools, cost, limits,
cancellation and the agent's failures (§5.5, §6, §12)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from prohost.engine.agent.brains import brain_for
from prohost.engine.agent.brains.acp import AcpTurn
from prohost.engine.agent.brains.acp_brain import AcpBrain
from prohost.engine.agent.brains.acp_limits import acp_limit_text
from prohost.engine.agent.brains.base import McpError
from prohost.engine.agent.process import ProcessGroups
from prohost.engine.agent.reply import MAX_REPLY_BYTES, REPLY_CUT_MARKER
from prohost.engine.run.agentfolders import agent_folders
from prohost.engine.sandbox import defaults
from prohost.execline import ACP_COMMANDS, acp_agent, speaks_acp
from prohost.wire.outcomes import (
    ACP_NO_ANSWER,
    ACP_NO_HTTP_MCP,
    acp_signed_out,
    acp_stopped,
    acp_version,
)
from prohost.wire.runs import Mcp
from prohost.wire.timeline import ToolEvent
from prohost.wire.usage import Usage
from tests.kits.acp import (
    FAKE_ACP,
    PROMPT,
    cancel_when_working,
    poller,
    talk,
)

__all__ = ["poller"]  # the autouse fixture, both ways of waiting


@pytest.mark.protocol("§5")
async def test_a_turn_is_initialize_a_new_session_and_one_text_prompt(tmp_path: Path) -> None:
    done = await talk(tmp_path)
    assert done.outcome is not None and done.outcome.ok
    assert done.outcome.reply == "Hello from the fake ACP agent."
    session = done.outcome.session_id
    assert session is not None and session.startswith("sess_")
    assert done.turn.started and done.turn.model == "fake-model-1"
    record = done.record()
    assert done.methods() == ["initialize", "session/new", "session/prompt", "eof"]
    init = record[0]["params"]
    assert init["protocolVersion"] == 1
    assert init["clientCapabilities"] == {
        "fs": {"readTextFile": False, "writeTextFile": False}, "terminal": False}
    assert record[1]["params"] == {"cwd": str(tmp_path), "mcpServers": []}
    assert record[2]["params"] == {"sessionId": session,
                                   "prompt": [{"type": "text", "text": PROMPT}]}
    # stdin was closed after the answer and the agent exited by itself.
    assert done.result is not None and done.result.exit_code == 0
    usage = done.outcome.usage
    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens) == (100, 50, 10)
    assert usage.cost_usd == 0.25 and usage.turns == 1 and usage.model == "fake-model-1"
    assert done.turn.session_totals() == Usage(cost_usd=0.25)


@pytest.mark.protocol("§5")
@pytest.mark.parametrize(("caps", "method"), [("load", "load"), ("resume", "resume"),
                                              ("both", "resume"),
                                              ("broken_resume", "resume")])
async def test_the_next_turn_takes_the_session_back_and_pays_only_its_share(
    tmp_path: Path, caps: str, method: str,
) -> None:
    first = await talk(tmp_path, FAKE_ACP_CAPS=caps)
    assert first.outcome is not None
    session = first.outcome.session_id
    totals = first.turn.session_totals()
    second = await talk(tmp_path, session=session, before=totals, FAKE_ACP_CAPS=caps)
    assert second.outcome is not None and second.outcome.ok
    assert second.outcome.session_id == session
    assert second.methods()[1] == f"session/{method}"
    if caps == "broken_resume":  # then loaded: the session was not refused
        assert second.methods()[2] == "session/load"
    # The replayed history of a load is never part of the reply.
    assert second.outcome.reply == "Hello from the fake ACP agent."
    assert second.outcome.usage is not None and second.outcome.usage.cost_usd == 0.25
    assert second.turn.session_totals() == Usage(cost_usd=0.5)


@pytest.mark.protocol("§5")
@pytest.mark.parametrize("caps", ["load", "resume", "none"])
async def test_a_session_the_agent_cannot_take_back_is_replaced_in_the_same_process(
    tmp_path: Path, caps: str,
) -> None:
    done = await talk(tmp_path, session="sess_gone", before=Usage(cost_usd=0.1),
                      FAKE_ACP_CAPS=caps)
    assert done.outcome is not None and done.outcome.ok
    assert done.outcome.session_id not in (None, "sess_gone")
    expected = ["initialize", "session/new", "session/prompt", "eof"]
    if caps != "none":
        expected.insert(1, f"session/{caps}")
    assert done.methods() == expected
    # The new session's cost counts from 0, not from the old one's total.
    assert done.outcome.usage is not None and done.outcome.usage.cost_usd == 0.25


async def test_no_reply_means_null(tmp_path: Path) -> None:
    done = await talk(tmp_path, FAKE_ACP_REPLY="  NO_REPLY\n")
    assert done.outcome is not None and done.outcome.ok and done.outcome.reply is None


@pytest.mark.protocol("§5", "§8")
async def test_a_permission_is_granted_once_and_the_tool_reaches_the_timeline(
    tmp_path: Path,
) -> None:
    done = await talk(tmp_path, "tools")
    assert done.outcome is not None and done.outcome.ok
    assert done.outcome.reply == "Let me run the tests.\n\nThe tool was allowed (once)."
    answer = next(m for m in done.record() if m.get("id") == 900)
    assert answer["result"] == {"outcome": {"outcome": "selected", "optionId": "once"}}
    assert [(e.id, e.name, e.state, e.summary) for e in done.events] == [
        ("call_1", "Execute", "calling", "Running pytest -q"),
        ("call_1", "Execute", "done", "Running pytest -q")]


async def test_safe_tools_answer_with_the_reject_option(tmp_path: Path) -> None:
    done = await talk(tmp_path, "tools", safe_tools=True)
    assert done.outcome is not None and done.outcome.ok
    assert done.outcome.reply is not None and done.outcome.reply.endswith("rejected (no).")
    assert [e.state for e in done.events] == ["calling", "error"]


@pytest.mark.protocol("§5")
@pytest.mark.parametrize("reason", ["refusal", "max_tokens", "max_turn_requests"])
async def test_a_stop_reason_other_than_end_turn_is_a_failure_naming_it(
    tmp_path: Path, reason: str,
) -> None:
    done = await talk(tmp_path, f"stop:{reason}")
    assert done.outcome is not None
    assert not done.outcome.ok and not done.outcome.retryable
    assert done.outcome.error == acp_stopped(reason) and reason in done.outcome.error
    assert done.outcome.session_id is not None


async def test_a_json_rpc_error_is_the_agents_error_text(tmp_path: Path) -> None:
    done = await talk(tmp_path, "error")
    assert done.outcome is not None and not done.outcome.ok
    assert done.outcome.error == (
        "the agent failed session/prompt: Internal error: the fake agent failed on purpose")
    assert done.outcome.session_id is not None and done.turn.limit is None


@pytest.mark.protocol("§12")
async def test_geminis_quota_error_is_a_usage_limit_with_its_reset(tmp_path: Path) -> None:
    done = await talk(tmp_path, "error", FAKE_ACP_ERROR=(
        "You have exhausted your capacity on this model. Your quota will reset after 1h2m3s."))
    assert done.outcome is not None and not done.outcome.ok
    limit = done.turn.limit
    assert limit is not None and limit.state == "limited" and limit.resets_at is not None
    assert abs(limit.resets_at - (time.time() + 3723)) < 60
    assert done.turn.ended_by_limit(done.outcome)
    assert "usage limit reached" in (done.outcome.error or "")


@pytest.mark.protocol("§12")
@pytest.mark.parametrize(("text", "limited"), [
    ('{"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).",'
     '"status":"RESOURCE_EXHAUSTED"}}', True),
    ("429 You exceeded your current quota, please check your plan and billing details.", True),
    ('{"code":429,"message":"No capacity available for model gemini-3-flash-preview",'
     '"status":"RESOURCE_EXHAUSTED","reason":"MODEL_CAPACITY_EXHAUSTED"}', False),
    ("You've hit your usage limit. Try again later.", True),
    ("Connection reset by peer", False),
])
def test_limit_texts(text: str, limited: bool) -> None:
    notice = acp_limit_text(text, 1_800_000_000.0)
    assert (notice is not None and notice.state == "limited") == limited


async def test_a_crash_mid_turn_is_left_to_the_runner_with_its_stderr(tmp_path: Path) -> None:
    done = await talk(tmp_path, "crash")
    assert done.outcome is None  # the runner says "exited with status 3: <stderr>"
    assert done.result is not None and done.result.exit_code == 3
    assert done.result.last_stderr_line == "fake acp: crashed mid-turn"
    assert done.turn.session_id is not None  # the session it started is kept


async def test_lines_that_are_not_acp_are_skipped(tmp_path: Path) -> None:
    done = await talk(tmp_path, "garbage")
    assert done.outcome is not None and done.outcome.ok
    assert done.outcome.reply == "Hello from the fake ACP agent."
    assert done.turn.garbage == 3


async def test_a_huge_message_is_cut_to_the_reply_limit(tmp_path: Path) -> None:
    done = await talk(tmp_path, "huge")
    assert done.outcome is not None and done.outcome.ok and done.outcome.reply is not None
    assert done.outcome.reply.endswith(REPLY_CUT_MARKER)
    assert len(done.outcome.reply.encode()) <= MAX_REPLY_BYTES


async def test_fs_is_not_offered(tmp_path: Path) -> None:
    done = await talk(tmp_path, "ask_fs")
    assert done.outcome is not None and done.outcome.reply == "fs answered -32601"


async def test_an_agent_that_leaves_without_answering(tmp_path: Path) -> None:
    done = await talk(tmp_path, "exit_early")
    assert done.outcome is not None and not done.outcome.ok
    assert done.outcome.error == ACP_NO_ANSWER


async def test_another_protocol_version_is_refused(tmp_path: Path) -> None:
    done = await talk(tmp_path, FAKE_ACP_VERSION="2")
    assert done.outcome is not None and done.outcome.error == acp_version(2)
    assert done.turn.session_id is None and done.methods() == ["initialize", "eof"]


@pytest.mark.protocol("§6")
async def test_a_cancel_sends_session_cancel_and_waits_for_the_prompt_to_return(
    tmp_path: Path,
) -> None:
    groups = ProcessGroups()
    groups.grace_s = 30.0  # long: the agent must end well before a signal
    started = trio.current_time()
    done = await cancel_when_working(tmp_path, "hang", groups)
    assert trio.current_time() - started < 15
    assert done.methods()[-3:] == ["session/prompt", "session/cancel", "eof"]
    assert done.turn.stop_reason == "cancelled" and done.turn.settled()
    assert done.turn.session_id is not None
    assert len(groups) == 0


@pytest.mark.protocol("§6")
async def test_an_agent_deaf_to_the_cancel_is_stopped_after_a_bounded_wait(
    tmp_path: Path,
) -> None:
    groups = ProcessGroups()
    groups.grace_s = 1.0
    with trio.fail_after(10):
        done = await cancel_when_working(tmp_path, "hang_deaf", groups)
    assert "session/cancel" in done.methods()
    assert done.turn.stop_reason is None and len(groups) == 0


@pytest.mark.protocol("§5")
async def test_a_timeout_also_asks_the_agent_to_cancel(tmp_path: Path) -> None:
    groups = ProcessGroups()
    groups.grace_s = 30.0
    done = await talk(tmp_path, "hang", groups=groups, deadline=trio.current_time() + 3)
    assert done.result is not None and done.result.timed_out == "total"
    assert done.methods()[-2:] == ["session/cancel", "eof"]
    assert done.turn.stop_reason == "cancelled"


@pytest.mark.parametrize("line", [
    "gemini --acp", "gemini --experimental-acp -m gemini-2.5-pro", "qwen --acp",
    "copilot --acp", "opencode acp", "goose acp", "cursor-agent acp",
    "claude-code-acp", "/usr/local/bin/claude-agent-acp", "codex-acp",
    "npx -y @zed-industries/codex-acp@0.3.1", "env FOO=1 gemini --acp",
    "npx @google/gemini-cli --acp", "npx @opencode/cli@2.0.23 acp", "kimi acp",
    "npx @github/copilot@1.0.80 --acp",
])
def test_auto_chooses_acp_for_the_known_command_lines(line: str) -> None:
    assert speaks_acp(line)
    assert isinstance(brain_for("auto", line), AcpBrain)


@pytest.mark.parametrize("line", ["gemini", "gemini -p hi", "opencode run x", "claude -p",
                                  "codex exec", "echo --acp", "npx", "",
                                  "npx @opencode/cli run", "npx @google/gemini-cli"])
def test_auto_leaves_other_lines_alone(line: str) -> None:
    assert not speaks_acp(line)
    assert not isinstance(brain_for("auto", line), AcpBrain)


def test_every_listed_program_is_recognised() -> None:
    for program, mode, _agent in ACP_COMMANDS:
        line = program if mode is None else f"{program} {mode}"
        assert speaks_acp(f"npx {line}" if program.startswith("@") else line)


def test_every_listed_program_names_an_agent_whose_folders_a_confined_run_gets(
        tmp_path: Path) -> None:
    # A confined ACP agent that cannot write its own folders does not start (issue 29):
    # each listed program is an agent of AGENT_FOLDERS, or an adapter of Claude or Codex.
    for program, mode, _agent in ACP_COMMANDS:
        line = program if mode is None else f"{program} {mode}"
        agent = acp_agent(f"npx -y {line}" if program.startswith("@") else line)
        assert agent in {*defaults.AGENT_FOLDERS, "claude", "codex"}, program
    assert acp_agent("npx -y @google/gemini-cli@0.61 --acp") == "gemini"
    # An option's value is not the package.
    assert acp_agent("npx --package foo @zed-industries/codex-acp") == "codex"
    assert acp_agent("claude-agent-acp") == "claude" and acp_agent("gemini") is None
    made = agent_folders("opencode", {}, tmp_path / "user", tmp_path / "home",
                         work=tmp_path / "work")
    granted, mounts = list(made.writable), list(made.mounts)
    owned = tmp_path / "home" / "agents" / "opencode" / "no-lane"
    assert granted == [owned / folder for folder in defaults.AGENT_FOLDERS["opencode"]]
    assert mounts == [(owned / folder, tmp_path / "user" / folder)
                      for folder in defaults.AGENT_FOLDERS["opencode"]]
    assert all(folder.is_dir() for folder in granted)
    # Where the agent looks is made (empty) for the binding, never granted.
    assert all(not any(seen.iterdir()) for _source, seen in mounts)
    assert not {seen for _source, seen in mounts} & set(granted)
    # Once the person has the folders, the run sees them through overlays whose
    # writes land in the harness's (each with a work folder of its own).
    again = agent_folders("opencode", {}, tmp_path / "user", tmp_path / "home",
                          work=tmp_path / "work2")
    assert again.mounts == ()
    assert [(lower, upper) for lower, upper, _ in again.overlays] == [
        (seen, source) for source, seen in mounts]
    assert len({work for _, _, work in again.overlays}) == len(mounts)


def line(message: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", **message}).encode()


class Pipe:
    """A StdinPipe that keeps what is written."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.sent.append(data)

    def close(self, linger_s: float = 5.0, eof: bool = True) -> None:
        if eof:
            self.sent.append(b"EOF")


def prompting_turn() -> tuple[AcpTurn, Pipe]:
    """A turn fed the answers that open session ``s1``: it has sent its prompt."""
    turn, pipe = AcpBrain(FAKE_ACP).new_turn(), Pipe()
    turn.conversation(PROMPT, None, Path("/tmp")).open(pipe)
    turn.feed(line({"id": 0, "result": {"protocolVersion": 1, "agentCapabilities": {}}}))
    turn.feed(line({"id": 1, "result": {"sessionId": "s1"}}))
    return turn, pipe


def test_tool_calls_are_the_activity_while_they_run() -> None:
    turn, pipe = prompting_turn()
    sent = pipe.sent
    assert turn.activity == "thinking" and turn.session_id == "s1"

    def update(body: dict[str, Any]) -> list[ToolEvent]:
        return turn.feed(line({"method": "session/update",
                               "params": {"sessionId": "s1", "update": body}}))

    update({"sessionUpdate": "tool_call", "toolCallId": "a", "title": "Reading app.py",
            "kind": "read", "status": "pending"})
    assert turn.activity == "Read: Reading app.py"
    update({"sessionUpdate": "tool_call", "toolCallId": "b", "title": "pytest -q",
            "kind": "execute", "status": "in_progress"})
    assert turn.activity == "Execute: pytest -q"
    ended = update({"sessionUpdate": "tool_call_update", "toolCallId": "b",
                    "status": "failed"})
    assert [(e.id, e.state) for e in ended] == [("b", "error")]
    assert turn.activity == "Read: Reading app.py"
    update({"sessionUpdate": "tool_call_update", "toolCallId": "a", "status": "completed"})
    assert turn.activity == "thinking"
    # An update for a call never announced posts nothing that would dangle.
    assert update({"sessionUpdate": "tool_call_update", "toolCallId": "zz",
                   "status": "completed"}) == []
    turn.feed(line({"id": 2, "result": {"stopReason": "end_turn"}}))
    assert turn.activity is None and sent[-1] == b"EOF"


@pytest.mark.parametrize("caps", ["load", "none"])
async def test_the_runs_mcp_server_goes_to_the_session_over_http(
    tmp_path: Path, caps: str,
) -> None:
    wiring = AcpBrain(FAKE_ACP).wire_mcp(Mcp(url="http://127.0.0.1:9/mcp", token="t0k3n"),
                                         tmp_path)
    first = await talk(tmp_path, mcp=wiring, FAKE_ACP_CAPS=caps)
    assert first.outcome is not None
    second = await talk(tmp_path, session=first.outcome.session_id, mcp=wiring,
                        FAKE_ACP_CAPS=caps)
    expected = [{"type": "http", "name": "prohost", "url": "http://127.0.0.1:9/mcp",
                 "headers": [{"name": "Authorization", "value": "Bearer t0k3n"}]}]
    for done in (first, second):
        setup = done.record()[1]
        assert setup["method"] in ("session/new", "session/load")
        assert setup["params"]["mcpServers"] == expected


async def test_an_agent_without_http_mcp_fails_a_run_with_an_mcp_server_closed(
    tmp_path: Path,
) -> None:
    wiring = AcpBrain(FAKE_ACP).wire_mcp(Mcp(url="http://127.0.0.1:9/mcp"), tmp_path)
    done = await talk(tmp_path, mcp=wiring, FAKE_ACP_NO_HTTP_MCP="1")
    assert done.outcome is not None and done.outcome.error == ACP_NO_HTTP_MCP
    assert done.methods() == ["initialize", "eof"]


def test_the_mcp_wiring_is_neither_argv_nor_env_nor_a_file(tmp_path: Path) -> None:
    wiring = AcpBrain(FAKE_ACP).wire_mcp(Mcp(url="http://127.0.0.1:9/mcp", token="t0k3n"),
                                         tmp_path)
    assert wiring.args == () and dict(wiring.env) == {}
    assert list(tmp_path.iterdir()) == []
    assert AcpBrain(FAKE_ACP).command(session_id=None, mcp=wiring) == FAKE_ACP


def test_an_mcp_url_an_agent_cannot_reach_is_refused_before_the_spawn(tmp_path: Path) -> None:
    with pytest.raises(McpError):
        AcpBrain(FAKE_ACP).wire_mcp(Mcp(url="ftp://example.org/mcp"), tmp_path)


async def test_an_agent_nobody_logged_in_to_says_so(tmp_path: Path) -> None:
    done = await talk(tmp_path, session="sess_kept", before=Usage(cost_usd=1.5),
                      FAKE_ACP_AUTH="1")
    assert done.outcome is not None
    assert done.outcome.error == acp_signed_out("Authentication required")
    # The lane keeps its session, and that session's totals as they were.
    assert done.turn.session_id is None
    assert done.turn.session_totals() == Usage(cost_usd=1.5)
    # The refused load is followed by a new session, refused the same way.
    assert done.methods() == ["initialize", "session/load", "session/new", "eof"]


def test_a_call_first_seen_in_a_permission_request_reaches_the_timeline_once() -> None:
    """Gemini CLI 0.61 sends no tool_call for a call that needs a permission: the
    request's toolCall, then a tool_call_update when it is done."""
    turn, _ = prompting_turn()
    asked = turn.feed(line({"id": 0, "method": "session/request_permission", "params": {
        "sessionId": "s1",
        "toolCall": {"toolCallId": "run_1", "status": "pending", "title": "touch x",
                     "kind": "execute"},
        "options": [{"optionId": "proceed_once", "name": "Allow", "kind": "allow_once"}]}}))
    assert [(e.id, e.name, e.state, e.summary) for e in asked] == [
        ("run_1", "Execute", "calling", "touch x")]
    again = turn.feed(line({"method": "session/update", "params": {"sessionId": "s1", "update": {
        "sessionUpdate": "tool_call", "toolCallId": "run_1", "title": "touch x",
        "kind": "execute", "status": "in_progress"}}}))
    assert again == []  # announced already
    done = turn.feed(line({"method": "session/update", "params": {"sessionId": "s1", "update": {
        "sessionUpdate": "tool_call_update", "toolCallId": "run_1", "status": "completed",
        "title": "touch x"}}}))
    assert [(e.id, e.state) for e in done] == [("run_1", "done")]
    late = turn.feed(line({"method": "session/update", "params": {"sessionId": "s1", "update": {
        "sessionUpdate": "tool_call_update", "toolCallId": "run_1", "status": "completed",
        "title": "touch x"}}}))
    assert late == []


async def test_the_claude_adapters_cost_counts_from_its_own_start(tmp_path: Path) -> None:
    env = {"FAKE_ACP_NAME": "@agentclientprotocol/claude-agent-acp",
           "FAKE_ACP_COST_PER_PROCESS": "1"}
    first = await talk(tmp_path, **env)
    assert first.outcome is not None and first.outcome.usage is not None
    second = await talk(tmp_path, session=first.outcome.session_id,
                        before=first.turn.session_totals(), **env)
    assert second.outcome is not None and second.outcome.usage is not None
    # Its total is this process's spend: all of it is the run's.
    assert first.outcome.usage.cost_usd == second.outcome.usage.cost_usd == 0.25
