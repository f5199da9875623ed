"""The Claude Code brain: its command line, its reading of stream-json, its MCP
config, and whole attempts through the real process runner with a fake ``claude``."""

from __future__ import annotations

import json
import os
import shlex
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from prohost.engine.agent.brains import brain_for
from prohost.engine.agent.brains.base import McpError, McpWiring
from prohost.engine.agent.brains.claude import ClaudeBrain, ClaudeTurn
from prohost.engine.agent.brains.summaries import tool_summary
from prohost.engine.agent.launch import Launch, ProcessLimits
from prohost.engine.agent.process import ProcessGroups, ProcessResult
from prohost.execline import has_flag, split_command
from prohost.wire.runs import Mcp
from prohost.wire.timeline import ToolEvent
from tests.kits.output import Heard, run_agent
from tests.kits.paths import AGENTS, logs_folder

FAKE = AGENTS / "fake_claude.py"
FAKE_EXEC = f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE))}"
SID = "8f5b2c1e-4a3d-4e6f-9b0a-1c2d3e4f5a6b"


def line(event: dict[str, Any]) -> bytes:
    return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()


# Recorded shapes (Claude Code 2.1, trimmed of nothing the parser must skip).
INIT = line({
    "type": "system", "subtype": "init", "cwd": "/work", "session_id": SID,
    "tools": ["Task", "Bash", "Read"], "mcp_servers": [{"name": "prohost", "status": "connected"}],
    "model": "claude-sonnet-4-5-20250929", "permissionMode": "bypassPermissions",
    "slash_commands": ["compact"], "apiKeySource": "none", "claude_code_version": "2.1.29",
    "output_style": "default", "agents": ["general-purpose"], "skills": [], "plugins": [],
    "uuid": "ee5e97bf-0000-0000-0000-000000000002",
})


def assistant(*content: dict[str, Any], **extra: Any) -> bytes:
    return line({
        "type": "assistant",
        "message": {"model": "claude-sonnet-4-5-20250929", "id": "msg_01ABC", "type": "message",
                    "role": "assistant", "content": list(content), "stop_reason": None,
                    "stop_sequence": None, "usage": {"input_tokens": 4, "output_tokens": 12}},
        "parent_tool_use_id": None, "session_id": SID, "uuid": "u-a", **extra,
    })


def tool_use(name: str, arguments: dict[str, Any], tool_id: str = "toolu_01") -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": name, "input": arguments}


def tool_result(tool_id: str = "toolu_01", *, is_error: bool = False) -> bytes:
    return line({
        "type": "user",
        "message": {"role": "user", "content": [
            {"tool_use_id": tool_id, "type": "tool_result", "content": "12 passed",
             "is_error": is_error}]},
        "parent_tool_use_id": None, "session_id": SID, "uuid": "u-u",
        "tool_use_result": {"stdout": "12 passed", "stderr": "", "interrupted": False,
                            "isImage": False},
    })


def result(text: str | None = "All done.", *, is_error: bool = False,
           subtype: str = "success", **extra: Any) -> bytes:
    event: dict[str, Any] = {
        "type": "result", "subtype": subtype, "is_error": is_error, "duration_ms": 5234,
        "duration_api_ms": 3890, "num_turns": 2, "session_id": SID, "total_cost_usd": 0.0342,
        "usage": {"input_tokens": 150, "output_tokens": 75, "cache_read_input_tokens": 1500,
                  "service_tier": "standard"},
        "modelUsage": {"claude-sonnet-4-5-20250929": {"inputTokens": 150, "costUSD": 0.0342}},
        "permission_denials": [], "uuid": "u-r", **extra,
    }
    if text is not None:
        event["result"] = text
    return line(event)


RATE_LIMIT = line({
    "type": "rate_limit_event",
    "rate_limit_info": {"status": "allowed", "resetsAt": 1771390800, "rateLimitType": "five_hour",
                        "overageStatus": "rejected", "overageDisabledReason": "org_level_disabled",
                        "isUsingOverage": False},
    "uuid": "76258cfb-0dc8-4d4b-8682-77082b59c03f", "session_id": SID,
})


def process(exit_code: int | None = 0, *, stderr: str = "", signal: int | None = None,
            timed_out: Any = None, overlong: int = 0) -> ProcessResult:
    return ProcessResult(exit_code=exit_code, signal=signal, stdout=b"", stdout_truncated=False,
                         last_stderr_line=stderr, timed_out=timed_out, duration_s=0.1,
                         overlong_lines=overlong)


def feed_all(turn: ClaudeTurn, *lines: bytes) -> list[ToolEvent]:
    events: list[ToolEvent] = []
    for item in lines:
        events.extend(turn.feed(item))
    return events


# --- reading the stream ------------------------------------------------------------


@pytest.mark.protocol("§5")
def test_init_sets_session_model_and_started() -> None:
    turn = ClaudeTurn()
    assert turn.feed(INIT) == []
    assert (turn.session_id, turn.model, turn.started) == (
        SID, "claude-sonnet-4-5-20250929", True)


@pytest.mark.protocol("§5", "§7")
def test_a_successful_result_is_the_reply_with_usage_and_cost() -> None:
    turn = ClaudeTurn()
    feed_all(turn, INIT, assistant({"type": "text", "text": "Working on it"}), result("Done: 3"))
    outcome = turn.finish(process(0))
    assert outcome is not None and outcome.ok
    assert outcome.reply == "Done: 3"
    assert outcome.session_id == SID
    # §7: in the protocol's keys, whatever the CLI calls them; the model from init.
    assert outcome.usage is not None
    assert outcome.usage.to_json() == {"input_tokens": 150, "output_tokens": 75,
                                       "cache_read_tokens": 1500, "cost_usd": 0.0342,
                                       "turns": 2, "model": "claude-sonnet-4-5-20250929"}
    assert turn.last_text == "Working on it"


@pytest.mark.protocol("§2", "§8")
def test_a_tool_call_is_timed_with_its_summary_and_sets_activity() -> None:
    turn = ClaudeTurn()
    turn.feed(INIT)
    calling = turn.feed(assistant({"type": "text", "text": "Running tests."},
                                  tool_use("Bash", {"command": "pytest -q",
                                                    "description": "Run tests"})))
    assert [(e.id, e.name, e.state, e.summary) for e in calling] == [
        ("toolu_01", "Bash", "calling", "pytest -q")]
    assert turn.activity == "Bash: pytest -q"
    done = turn.feed(tool_result())
    assert [(e.id, e.name, e.state, e.summary) for e in done] == [
        ("toolu_01", "Bash", "done", "pytest -q")]
    assert turn.activity == "thinking"
    assert done[0].to_json()["state"] == "done"


@pytest.mark.protocol("§2", "§8")
def test_a_failed_tool_result_is_an_error_row_and_activity_follows_open_calls() -> None:
    turn = ClaudeTurn()
    feed_all(turn, INIT, assistant(tool_use("Read", {"file_path": "/a.py"}, "toolu_a"),
                                   tool_use("Grep", {"pattern": "TODO"}, "toolu_b")))
    assert turn.activity == "Grep: TODO"
    events = turn.feed(tool_result("toolu_b", is_error=True))
    assert [(e.id, e.name, e.state) for e in events] == [("toolu_b", "Grep", "error")]
    assert turn.activity == "Read: /a.py"  # still running
    assert turn.feed(tool_result("toolu_a"))[0].state == "done"
    assert turn.activity == "thinking"
    # A result for a call never seen posts nothing (its row would dangle).
    assert turn.feed(tool_result("toolu_unknown")) == []


@pytest.mark.protocol("§8")
@pytest.mark.parametrize(
    ("name", "arguments", "summary"),
    [
        ("Bash", {"command": "pytest -q", "description": "tests"}, "pytest -q"),
        ("Bash", {"command": "echo one\n  && echo two"}, "echo one && echo two"),
        ("Read", {"file_path": "/src/app.py", "offset": 10}, "/src/app.py"),
        ("Write", {"file_path": "/src/new.py", "content": "x" * 5000}, "/src/new.py"),
        ("Edit", {"file_path": "/src/a.py", "old_string": "a", "new_string": "b"}, "/src/a.py"),
        ("MultiEdit", {"file_path": "/src/b.py", "edits": []}, "/src/b.py"),
        ("NotebookEdit", {"notebook_path": "/n.ipynb", "new_source": "x"}, "/n.ipynb"),
        ("Grep", {"pattern": "def main", "path": "src"}, "def main"),
        ("Glob", {"pattern": "**/*.py"}, "**/*.py"),
        ("WebFetch", {"url": "https://example.com", "prompt": "summarise"},
         "https://example.com"),
        ("WebSearch", {"query": "trio nurseries"}, "trio nurseries"),
        ("Task", {"description": "Find callers", "prompt": "long " * 100,
                  "subagent_type": "Explore"}, "Find callers"),
        ("TodoWrite", {"todos": [{"content": "a"}, {"content": "b"}, {"content": "c"}]},
         "3 items"),
        ("TodoWrite", {"todos": [{"content": "a"}]}, "1 item"),
        ("mcp__prohost__send_message", {"count": 2, "text": "hello there"},
         "send_message: hello there"),
        ("mcp__prohost__list_threads", {}, "list_threads"),
        ("SomeNewTool", {"blob": "y" * 500, "name": "short one"}, "short one"),
        ("SomeNewTool", {"n": 1}, ""),
        ("Bash", "not a dict", ""),
    ],
)
def test_tool_summaries(name: str, arguments: Any, summary: str) -> None:
    assert tool_summary(name, arguments) == summary


@pytest.mark.protocol("§8")
def test_a_long_summary_is_one_cut_line() -> None:
    summary = tool_summary("Bash", {"command": "echo " + "word " * 100})
    assert len(summary) == 120 and summary.endswith("…") and "\n" not in summary


@pytest.mark.protocol("§5")
def test_unknown_events_and_garbage_are_skipped_without_raising() -> None:
    turn = ClaudeTurn()
    junk = [
        b"", b"   ", b"not json", b"{not json", b"[1,2,3]", b"\xff\xfe{", b"null", b"{}",
        b'{"type":"stream_event","event":{"type":"content_block_delta"}}',
        b'{"type":"system","subtype":"hook_started","hook_name":"SessionStart"}',
        b'{"type":"system","subtype":"compact_boundary"}',
        b'{"type":"future_event","payload":[1]}',
        b'{"type":"assistant"}', b'{"type":"assistant","message":"text"}',
        b'{"type":"assistant","message":{"content":[null,1,"x",{"type":"tool_use"}]}}',
        b'{"type":"assistant","message":{"content":[{"type":"tool_use","id":5,"name":[],'
        b'"input":"cmd"}]}}',
        b'{"type":"user","message":{"content":"plain"}}',
        b'{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":null}]}}',
        b'{"type":"rate_limit_event","rate_limit_info":"x"}',
        b'{"type":"system","subtype":"init","model":7,"session_id":9}',
        b'{"type":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    ]
    events = feed_all(turn, *junk)
    # Only the two nameless tool_use blocks produce (calling) rows.
    assert [(e.name, e.state) for e in events] == [("tool", "calling"), ("tool", "calling")]
    assert turn.session_id is None and turn.model is None
    assert turn.result_event is None
    # Then a normal run still reads normally.
    feed_all(turn, INIT, result("fine"))
    outcome = turn.finish(process(0))
    assert outcome is not None and outcome.reply == "fine"


@pytest.mark.protocol("§12")
def test_a_rate_limit_event_is_read_without_changing_the_outcome() -> None:
    turn = ClaudeTurn()
    assert feed_all(turn, INIT, RATE_LIMIT, assistant({"type": "text", "text": "hi"}),
                    result("hi")) == []
    assert turn.rate_limit is not None and turn.rate_limit["status"] == "allowed"
    outcome = turn.finish(process(0))
    assert outcome is not None and outcome.ok and outcome.reply == "hi"


@pytest.mark.protocol("§12")
def test_a_rejected_rate_limit_says_when_it_resets() -> None:
    turn = ClaudeTurn()
    rejected = RATE_LIMIT.replace(b'"status":"allowed"', b'"status":"rejected"')
    feed_all(turn, INIT, rejected,
             result("You've hit your session limit · resets 3pm", is_error=True))
    outcome = turn.finish(process(1))
    assert outcome is not None and not outcome.ok
    assert outcome.error is not None
    assert outcome.error.startswith("You've hit your session limit")
    assert "resets at 2026-02-18 05:00 UTC" in outcome.error


@pytest.mark.protocol("§5")
def test_a_five_mib_line_is_read() -> None:
    turn = ClaudeTurn()
    huge = assistant({"type": "text", "text": "x" * (5 * 1024 * 1024)},
                     tool_use("Bash", {"command": "ls"}))
    assert len(huge) > 5 * 1024 * 1024
    events = feed_all(turn, INIT, huge)
    assert [e.summary for e in events] == ["ls"]
    assert turn.last_text is not None and len(turn.last_text) == 5 * 1024 * 1024


@pytest.mark.protocol("§5")
def test_a_subagents_text_is_not_the_last_text() -> None:
    turn = ClaudeTurn()
    feed_all(turn, INIT, assistant({"type": "text", "text": "main"}),
             assistant({"type": "text", "text": "sub"}, parent_tool_use_id="toolu_task"))
    assert turn.last_text == "main"


@pytest.mark.protocol("§5")
def test_a_signed_out_cli_is_a_clear_failure_never_a_reply() -> None:
    turn = ClaudeTurn()
    text = "Invalid API key · Please run /login"
    feed_all(turn, INIT, assistant({"type": "text", "text": text}, error="authentication_failed"),
             result(text, is_error=True))
    outcome = turn.finish(process(1))
    assert outcome is not None and not outcome.ok and outcome.reply is None
    assert outcome.error is not None
    assert "not logged in" in outcome.error and text in outcome.error
    assert outcome.session_id == SID


@pytest.mark.protocol("§5")
@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (result(None, subtype="error_max_turns", is_error=True), "turn limit"),
        (result(None, subtype="error_max_turns", is_error=False), "turn limit"),
        (result(None, subtype="error_max_budget_usd", is_error=True),
         "the run reached its budget (it spent $0.0342)"),
        (result(None, subtype="error_brand_new", is_error=True), "error_brand_new"),
        (result(None, subtype="error_during_execution", is_error=True,
                errors=["Connection timeout"]),
         "Claude Code failed during the run: Connection timeout"),
        (result("Prompt is too long", is_error=True), "Prompt is too long"),
        (result(None, is_error=True), "without saying what it was"),
    ],
)
def test_error_results_are_failures_naming_what_happened(event: bytes, expected: str) -> None:
    turn = ClaudeTurn()
    feed_all(turn, INIT, event)
    outcome = turn.finish(process(1))
    assert outcome is not None and not outcome.ok
    assert outcome.error is not None and expected in outcome.error
    assert outcome.session_id == SID
    assert outcome.usage is not None and outcome.usage.cost_usd == 0.0342


@pytest.mark.protocol("§5")
def test_no_result_event() -> None:
    turn = ClaudeTurn()
    feed_all(turn, INIT, assistant({"type": "text", "text": "I was about\nto say"}))
    # A failed process: the runner says how it failed.
    assert turn.finish(process(1, stderr="boom")) is None
    assert turn.finish(process(None, signal=9)) is None
    # A clean exit with no result is still not a reply.
    outcome = turn.finish(process(0))
    assert outcome is not None and not outcome.ok and outcome.session_id == SID
    assert outcome.error == (
        'Claude Code ended without a result; its last message was: "I was about to say"')
    overlong = turn.finish(process(0, overlong=1))
    assert overlong is not None and overlong.error is not None
    assert "too long to read" in overlong.error
    assert ClaudeTurn().finish(process(0)) is not None


@pytest.mark.protocol("§5")
def test_resume_rejected() -> None:
    def rejected(*lines: bytes, **kwargs: Any) -> bool:
        turn = ClaudeTurn()
        feed_all(turn, *lines)
        return turn.resume_rejected(process(**kwargs))

    no_conversation = result(None, subtype="error_during_execution", is_error=True,
                             errors=[f"No conversation found with session ID: {SID}"])
    assert rejected(no_conversation, exit_code=1)
    assert rejected(exit_code=1, stderr=f"No conversation found with session ID: {SID}")
    assert rejected(exit_code=1, stderr="error: something before init")
    assert rejected(b"garbage", exit_code=2)
    # The session started, or the CLI explained some other failure: not a resume problem.
    assert not rejected(INIT, exit_code=1)
    assert not rejected(INIT, result("Invalid API key · Please run /login", is_error=True),
                        exit_code=1)
    assert not rejected(result("Invalid API key · Please run /login", is_error=True),
                        exit_code=1)
    assert not rejected(exit_code=0)
    assert not rejected(exit_code=None, signal=15)
    assert not rejected(exit_code=None, signal=15, timed_out="idle")
    # A reply that merely mentions the sentence is a reply.
    assert not rejected(INIT, result("No conversation found with session ID: x is an error"),
                        exit_code=0)


# --- the command line --------------------------------------------------------------


@pytest.mark.protocol("§5")
def test_command_adds_the_stream_flags_once() -> None:
    brain = ClaudeBrain("claude -p")
    assert brain.name == "claude" and brain.streams
    assert brain.command(session_id=None, mcp=None) == (
        "claude -p --output-format stream-json --verbose --dangerously-skip-permissions")


@pytest.mark.protocol("§5")
@pytest.mark.parametrize(
    "exec_line",
    [
        "claude -p --output-format stream-json --verbose --dangerously-skip-permissions",
        "claude --print --output-format=stream-json --verbose --dangerously-skip-permissions",
        "claude --verbose --dangerously-skip-permissions -p --output-format stream-json",
    ],
)
def test_command_does_not_duplicate_flags_the_user_gave(exec_line: str) -> None:
    assert ClaudeBrain(exec_line).command(session_id=None, mcp=None) == exec_line


@pytest.mark.protocol("§5")
def test_command_keeps_the_users_words_exactly() -> None:
    exec_line = "ANTHROPIC_MODEL='x y'  claude   -p --model \"opus\""
    command = ClaudeBrain(exec_line).command(session_id=None, mcp=None)
    assert command.startswith(exec_line + " ")


@pytest.mark.protocol("§5")
def test_command_adds_print_mode_when_missing() -> None:
    command = ClaudeBrain("claude --model opus").command(session_id=None, mcp=None)
    assert split_command(command) == [
        "claude", "--model", "opus", "-p", "--output-format", "stream-json", "--verbose",
        "--dangerously-skip-permissions"]


@pytest.mark.protocol("§5")
def test_safe_tools_and_a_chosen_permission_mode_keep_permissions() -> None:
    safe = ClaudeBrain("claude -p", safe_tools=True).command(session_id=None, mcp=None)
    assert not has_flag(safe, "--dangerously-skip-permissions")
    chosen = ClaudeBrain("claude -p --permission-mode acceptEdits").command(
        session_id=None, mcp=None)
    assert not has_flag(chosen, "--dangerously-skip-permissions")


@pytest.mark.protocol("§5")
@pytest.mark.parametrize("session_id", [SID, "a b", "it's; rm -rf /", "$(touch x)", "-x"])
def test_resume_is_one_quoted_word(session_id: str) -> None:
    command = ClaudeBrain("claude -p").command(session_id=session_id, mcp=None)
    assert split_command(command)[-1] == f"--resume={session_id}"
    assert ClaudeBrain("claude -p").command(session_id=None, mcp=None).count("--resume") == 0


@pytest.mark.protocol("§5")
def test_mcp_args_come_last_and_quoted() -> None:
    wiring = McpWiring(args=("--mcp-config", "/tmp/run dir/mcp.json"))
    command = ClaudeBrain("claude -p").command(session_id="s1", mcp=wiring)
    assert split_command(command)[-3:] == ["--resume=s1", "--mcp-config", "/tmp/run dir/mcp.json"]


def test_version_command() -> None:
    assert ClaudeBrain("claude -p").version_command() == "claude --version"
    assert ClaudeBrain("'/opt/my claude/claude' -p").version_command() == (
        "'/opt/my claude/claude' --version")
    assert ClaudeBrain("env FOO=1 claude -p").version_command() == "env FOO=1 claude --version"
    assert ClaudeBrain("").version_command() is None


def test_brain_for_picks_claude() -> None:
    assert isinstance(brain_for("auto", "/usr/local/bin/claude -p"), ClaudeBrain)
    assert brain_for("claude", FAKE_EXEC, safe_tools=True).safe_tools


# --- the MCP config ----------------------------------------------------------------


def test_wire_mcp_writes_a_private_http_config(tmp_path: Path) -> None:
    wiring = ClaudeBrain("claude -p").wire_mcp(Mcp(url="https://chat.example/mcp", token="t0k"),
                                                tmp_path)
    path = tmp_path / "mcp.json"
    assert wiring.args == ("--mcp-config", str(path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {"mcpServers": {"prohost": {
        "type": "http", "url": "https://chat.example/mcp",
        "headers": {"Authorization": "Bearer t0k"}}}}


def test_wire_mcp_without_a_token_has_no_headers(tmp_path: Path) -> None:
    ClaudeBrain("claude -p").wire_mcp(Mcp(url="http://127.0.0.1:9/mcp"), tmp_path)
    server = json.loads((tmp_path / "mcp.json").read_text())["mcpServers"]["prohost"]
    assert server == {"type": "http", "url": "http://127.0.0.1:9/mcp"}


def test_wire_mcp_in_safe_mode_preapproves_the_runs_own_server(tmp_path: Path) -> None:
    wiring = ClaudeBrain("claude -p", safe_tools=True).wire_mcp(
        Mcp(url="https://chat.example/mcp"), tmp_path)
    assert wiring.args[0] == "--allowedTools=mcp__prohost"


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "ftp://x/mcp", "https://", "chat.example/mcp", "",
            "https://chat.example/m cp", "https://chat.example/\nmcp",
            "https://chat.example/m\x7fcp"])
def test_wire_mcp_refuses_a_bad_url(tmp_path: Path, url: str) -> None:
    with pytest.raises(McpError, match="URL"):
        ClaudeBrain("claude -p").wire_mcp(Mcp(url=url, token="secret"), tmp_path)
    assert not (tmp_path / "mcp.json").exists()


def test_wire_mcp_refuses_a_token_that_breaks_a_header(tmp_path: Path) -> None:
    with pytest.raises(McpError, match="token"):
        ClaudeBrain("claude -p").wire_mcp(Mcp(url="https://x/mcp", token="a\r\nX: y"), tmp_path)


def test_wire_mcp_reports_an_unwritable_folder(tmp_path: Path) -> None:
    with pytest.raises(McpError, match="could not write"):
        ClaudeBrain("claude -p").wire_mcp(Mcp(url="https://x/mcp"), tmp_path / "missing")


# --- whole attempts through run_agent ---------------------------------------------


def fake_env(tmp_path: Path, scenario: str, **extra: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "FAKE_CLAUDE_SCENARIO": scenario,
        "FAKE_CLAUDE_RECORD": str(logs_folder(tmp_path) / "record.json"),
        "PROHOST_RUN_ID": "run_c1",
        "PROHOST_PAIRED_RUN": "1",
        **extra,
    }


async def attempt(
    tmp_path: Path,
    scenario: str,
    *,
    session_id: str | None = None,
    mcp: McpWiring | None = None,
    deadline: float = float("inf"),
    env: dict[str, str] | None = None,
) -> tuple[ClaudeTurn, ProcessResult, list[ToolEvent]]:
    brain = ClaudeBrain(FAKE_EXEC)
    turn = brain.new_turn()
    events: list[ToolEvent] = []
    groups = ProcessGroups()
    groups.grace_s = 0.5
    result = await run_agent(
        Launch(command=brain.command(session_id=session_id, mcp=mcp),
               stdin_text="Please run the tests.", cwd=tmp_path,
               env=env or fake_env(tmp_path, scenario)),
        groups,
        ProcessLimits(deadline=deadline),
        Heard(on_line=lambda raw: events.extend(turn.feed(raw))),
    )
    assert len(groups) == 0
    return turn, result, events


def recorded(tmp_path: Path) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = json.loads((logs_folder(tmp_path) / "record.json").read_text())
    return entries


@pytest.mark.protocol("§5", "§7")
async def test_end_to_end_reply(tmp_path: Path) -> None:
    with trio.fail_after(20):
        turn, result, events = await attempt(tmp_path, "reply")
    assert result.exit_code == 0 and events == []
    outcome = turn.finish(result)
    assert outcome is not None and outcome.ok
    assert outcome.reply == "Hello from the fake Claude."
    assert outcome.session_id == turn.session_id and turn.started
    assert outcome.usage is not None and outcome.usage.cost_usd == 0.0342
    assert turn.model == "claude-sonnet-4-5-20250929"
    [entry] = recorded(tmp_path)
    assert entry["prompt"] == "Please run the tests."
    assert entry["argv"] == ["-p", "--output-format", "stream-json", "--verbose",
                             "--dangerously-skip-permissions"]
    assert entry["env"] == {"PROHOST_RUN_ID": "run_c1", "PROHOST_PAIRED_RUN": "1"}
    assert entry["claudecode_set"] is False


@pytest.mark.protocol("§8")
async def test_end_to_end_tool_call_timeline(tmp_path: Path) -> None:
    with trio.fail_after(20):
        turn, result, events = await attempt(tmp_path, "tool")
    assert [(e.name, e.state, e.summary) for e in events] == [
        ("Bash", "calling", "pytest -q"), ("Bash", "done", "pytest -q")]
    assert events[0].id == events[1].id and events[0].id.startswith("toolu_")
    assert turn.activity is None  # the result ends the activity
    outcome = turn.finish(result)
    assert outcome is not None and outcome.reply == "Hello from the fake Claude."


@pytest.mark.protocol("§5")
async def test_end_to_end_noise_is_skipped(tmp_path: Path) -> None:
    with trio.fail_after(20):
        turn, result, events = await attempt(tmp_path, "noise")
    assert [e.state for e in events] == ["calling", "done"]
    outcome = turn.finish(result)
    assert outcome is not None and outcome.ok and outcome.reply == "Hello from the fake Claude."


@pytest.mark.protocol("§12")
async def test_end_to_end_rate_limit_event(tmp_path: Path) -> None:
    with trio.fail_after(20):
        turn, result, _ = await attempt(tmp_path, "rate_limit")
    assert turn.rate_limit is not None and turn.rate_limit["rateLimitType"] == "five_hour"
    outcome = turn.finish(result)
    assert outcome is not None and outcome.ok


@pytest.mark.protocol("§5")
async def test_end_to_end_huge_line(tmp_path: Path) -> None:
    with trio.fail_after(30):
        turn, result, _ = await attempt(tmp_path, "huge_line")
    assert result.overlong_lines == 0
    assert turn.last_text is not None and len(turn.last_text) == 5 * 1024 * 1024
    outcome = turn.finish(result)
    assert outcome is not None and outcome.ok and outcome.reply == "Hello from the fake Claude."


@pytest.mark.protocol("§5")
async def test_end_to_end_signed_out_is_a_failure(tmp_path: Path) -> None:
    with trio.fail_after(20):
        turn, result, _ = await attempt(tmp_path, "is_error", session_id=SID)
    assert result.exit_code == 1
    assert not turn.resume_rejected(result)
    outcome = turn.finish(result)
    assert outcome is not None and not outcome.ok
    assert outcome.error is not None and "Invalid API key · Please run /login" in outcome.error
    assert "not logged in" in outcome.error


@pytest.mark.protocol("§5")
async def test_end_to_end_unknown_session_is_rejected_then_fresh_works(tmp_path: Path) -> None:
    with trio.fail_after(20):
        turn, result, _ = await attempt(tmp_path, "no_session", session_id="gone-1")
        assert result.exit_code == 1 and not turn.started
        assert turn.resume_rejected(result)
        assert "No conversation found with session ID: gone-1" in result.last_stderr_line
        fresh, again, _ = await attempt(tmp_path, "no_session")
    assert not fresh.resume_rejected(again)
    outcome = fresh.finish(again)
    assert outcome is not None and outcome.ok and outcome.session_id != "gone-1"
    first, second = recorded(tmp_path)
    assert "--resume=gone-1" in first["argv"]
    assert not any(word.startswith("--resume") for word in second["argv"])


async def test_end_to_end_mcp_config_reaches_the_cli(tmp_path: Path) -> None:
    folder = tmp_path / "scratch"
    folder.mkdir(mode=0o700)
    brain = ClaudeBrain(FAKE_EXEC)
    wiring = brain.wire_mcp(Mcp(url="https://chat.example/mcp", token="tok-1"), folder)
    with trio.fail_after(20):
        turn, result, _ = await attempt(tmp_path, "reply", mcp=wiring, session_id="s 1")
    assert turn.finish(result) is not None
    [entry] = recorded(tmp_path)
    assert entry["argv"][-3:] == ["--resume=s 1", "--mcp-config", str(folder / "mcp.json")]
    assert entry["mcp_config_mode"] == 0o600
    assert entry["mcp_config"]["mcpServers"]["prohost"]["headers"] == {
        "Authorization": "Bearer tok-1"}


@pytest.mark.protocol("§5")
async def test_end_to_end_errors_forever_is_stopped_by_the_deadline(tmp_path: Path) -> None:
    with trio.fail_after(20):
        turn, result, events = await attempt(
            tmp_path, "errors_forever", deadline=trio.current_time() + 1)
    assert result.timed_out == "total"
    assert "API Error: 529 Overloaded" in result.last_stderr_line
    assert events == [] and turn.result_event is None
    assert not turn.resume_rejected(result)
    assert turn.finish(result) is None  # the runner describes a stopped process


class _Timeline:
    """A run's timeline sink that keeps what it is given."""

    def __init__(self) -> None:
        self.events: list[ToolEvent] = []

    def add(self, events: list[ToolEvent]) -> None:
        self.events.extend(events)


@pytest.mark.protocol("§5")
async def test_through_execute_a_rejected_resume_is_retried_fresh(tmp_path: Path) -> None:
    from prohost.engine.agent.environment import scratch_folder
    from prohost.engine.run.execute import ExecSpec
    from prohost.engine.run.heldrun import HeldRun
    from prohost.wire.runs import AgentRun
    from tests.kits.runner import solo_runner

    run = AgentRun(run_id="run_c2", completion_path="/c", text="hi",
                   mcp=Mcp(url="https://chat.example/mcp", token="tok-2"))
    spec = ExecSpec(command=FAKE_EXEC, workdir=tmp_path / "work", timeout_s=0,
                    idle_timeout_s=30, parallel=False, secrets=())
    # The harness sets the run markers itself and drops CLAUDECODE (nested-run guard).
    env = fake_env(tmp_path, "no_session", CLAUDECODE="1")
    del env["PROHOST_RUN_ID"], env["PROHOST_PAIRED_RUN"]
    timeline = _Timeline()
    held = HeldRun.of(run)
    progress = held.progress
    groups = ProcessGroups()
    with trio.fail_after(20):
        async with solo_runner(tmp_path / "solo", spec, ClaudeBrain(FAKE_EXEC), groups=groups,
                               env=env, scratch_root=tmp_path / "runs") as solo:
            outcome = await solo.outcome(run, session_id="gone-2", held=held,
                                         timeline=timeline)
    assert not scratch_folder(tmp_path / "runs", "run_c2").exists()
    assert outcome.ok and outcome.reply == "Hello from the fake Claude."
    assert outcome.session_id not in (None, "gone-2")
    assert progress.attempts == 2 and progress.model == "claude-sonnet-4-5-20250929"
    first, second = recorded(tmp_path)
    assert "--resume=gone-2" in first["argv"] and "--mcp-config" in second["argv"]
    assert second["mcp_config_mode"] == 0o600
    assert second["env"] == {"PROHOST_RUN_ID": "run_c2", "PROHOST_PAIRED_RUN": "1"}
    assert second["claudecode_set"] is False
    assert timeline.events == []  # the reply scenario calls no tools


# --- usage limits ------------------------------------------------------------------

#: 2026-02-18 12:00 UTC, the moment "resets 8pm" is read against.
NOON = 1771416000.0


@pytest.mark.protocol("§12")
def test_an_allowed_warning_is_a_warning_with_its_use() -> None:
    turn = ClaudeTurn()
    warning = RATE_LIMIT.replace(b'"status":"allowed"',
                                 b'"status":"allowed_warning","utilization":0.91')
    feed_all(turn, INIT, warning, assistant({"type": "text", "text": "hi"}), result("hi"))
    outcome = turn.finish(process(0))
    assert outcome is not None and outcome.ok and outcome.reply == "hi"
    assert turn.limit is not None and turn.limit.state == "warning"
    assert turn.limit.used_percent == pytest.approx(91.0)
    assert turn.limit.resets_at == 1771390800


@pytest.mark.protocol("§12")
def test_the_newer_limit_text_ends_the_run_limited_with_its_reset() -> None:
    turn = ClaudeTurn(clock=lambda: NOON)
    text = "You've hit your limit · resets 8pm (Europe/Paris)"
    feed_all(turn, INIT,
             assistant({"type": "text", "text": text}, error="rate_limit"),
             result(text, is_error=True))
    outcome = turn.finish(process(1))
    assert outcome is not None and not outcome.ok
    assert turn.limit is not None and turn.limit.state == "limited"
    assert turn.limit.resets_at == NOON + 7 * 3600  # 20:00 in Paris is 19:00 UTC
    assert outcome.error == (f"{text} (Claude usage limit reached; "
                             "it resets at 2026-02-18 19:00 UTC)")
    assert turn.ended_by_limit(outcome)


@pytest.mark.protocol("§12")
def test_the_legacy_limit_result_is_limited_even_when_not_marked_an_error() -> None:
    turn = ClaudeTurn(clock=lambda: NOON)
    feed_all(turn, INIT, result("Claude AI usage limit reached|1771430400"))
    turn.finish(process(0))
    assert turn.limit is not None and turn.limit.state == "limited"
    assert turn.limit.resets_at == 1771430400


@pytest.mark.protocol("§12")
def test_a_limit_text_without_a_readable_time_is_limited_without_one() -> None:
    turn = ClaudeTurn(clock=lambda: NOON)
    feed_all(turn, INIT, assistant({"type": "text", "text": "Rate limited."}, error="rate_limit"),
             result("API Error: Rate limit reached", is_error=True))
    outcome = turn.finish(process(1))
    assert turn.limit is not None and turn.limit.state == "limited"
    assert turn.limit.resets_at is None
    assert outcome is not None and outcome.error is not None
    assert "Claude usage limit reached; it did not say when it resets" in outcome.error


@pytest.mark.protocol("§12")
def test_a_reply_that_quotes_a_limit_message_is_not_a_limit() -> None:
    turn = ClaudeTurn(clock=lambda: NOON)
    reply = "I added handling for \"You've hit your limit · resets 8pm\" to the parser."
    feed_all(turn, INIT, assistant({"type": "text", "text": reply}), result(reply))
    outcome = turn.finish(process(0))
    assert outcome is not None and outcome.ok and turn.limit is None
    assert not turn.ended_by_limit(outcome)


@pytest.mark.protocol("§12")
def test_a_success_despite_a_rejected_event_did_not_end_by_the_limit() -> None:
    turn = ClaudeTurn()
    rejected = RATE_LIMIT.replace(b'"status":"allowed"', b'"status":"rejected"')
    feed_all(turn, INIT, assistant({"type": "text", "text": "done"}), rejected, result("done"))
    outcome = turn.finish(process(0))
    assert outcome is not None and outcome.ok
    assert turn.limit is not None and turn.limit.state == "limited"  # the next run moves
    assert not turn.ended_by_limit(outcome)


@pytest.mark.protocol("§12")
def test_other_failures_did_not_end_by_the_limit() -> None:
    turn = ClaudeTurn()
    feed_all(turn, INIT, RATE_LIMIT, result("Something broke", is_error=True))
    outcome = turn.finish(process(1))
    assert outcome is not None and not outcome.ok and not turn.ended_by_limit(outcome)


def split_around_rate_limit(event_line: bytes, cut: int) -> tuple[bytes, bytes]:
    """What Claude Code 2.1.74 wrote (anthropics/claude-code#49640): a whole
    rate_limit_event line inside another event's line, cutting it in two."""
    return event_line[:cut] + RATE_LIMIT, event_line[cut:]


@pytest.mark.protocol("§5", "§12")
def test_a_rate_limit_event_inside_the_reply_line_loses_neither() -> None:
    reply = "The build is fixed: the fixture path was wrong and is now relative."
    whole = assistant({"type": "text", "text": reply})
    first, second = split_around_rate_limit(whole, whole.index(b"fixture"))
    turn = ClaudeTurn()
    feed_all(turn, INIT, first, second)
    assert turn.last_text == reply
    assert turn.rate_limit is not None and turn.rate_limit["status"] == "allowed"
    assert turn.limit is not None and turn.limit.state == "ok"
    # The result line too (the reply is its text).
    final = result(reply)
    first, second = split_around_rate_limit(final, final.index(b"relative"))
    feed_all(turn, first, second)
    outcome = turn.finish(process(0))
    assert outcome is not None and outcome.ok and outcome.reply == reply


@pytest.mark.protocol("§12")
def test_a_split_line_whose_rest_never_comes_is_dropped_quietly() -> None:
    whole = assistant({"type": "text", "text": "partial answer"})
    first, _ = split_around_rate_limit(whole, whole.index(b"answer"))
    turn = ClaudeTurn()
    feed_all(turn, INIT, first, b"garbage that is not the rest", b"{also not",
             assistant({"type": "text", "text": "next"}), result("next"))
    assert turn.rate_limit is not None
    outcome = turn.finish(process(0))
    assert outcome is not None and outcome.ok and outcome.reply == "next"


def account_env(tmp_path: Path, name: str, **files: str) -> dict[str, str]:
    folder = tmp_path / name
    folder.mkdir()
    for file, content in files.items():
        (folder / file).write_text(content)
    return fake_env(tmp_path, "reply", CLAUDE_CONFIG_DIR=str(folder))


@pytest.mark.protocol("§12")
async def test_end_to_end_a_limited_account_refuses_in_the_real_shape(tmp_path: Path) -> None:
    resets = 1771430400  # 2026-02-18 16:00 UTC: a whole hour, as the CLI gives it
    with trio.fail_after(20):
        turn, result, _ = await attempt(tmp_path, "reply",
                                        env=account_env(tmp_path, "work", limit=str(resets)))
    assert result.exit_code == 1
    outcome = turn.finish(result)
    assert outcome is not None and not outcome.ok
    assert outcome.error is not None and outcome.error.startswith("You've hit your limit · resets")
    assert "Claude usage limit reached; it resets at 2026-02-18 16:00 UTC" in outcome.error
    assert turn.limit is not None and turn.limit.state == "limited"
    assert turn.limit.resets_at == resets
    assert not turn.resume_rejected(result)  # a limit is not a lost session
    assert turn.ended_by_limit(outcome)
    [entry] = recorded(tmp_path)
    assert entry["config_dir"] == str(tmp_path / "work")


@pytest.mark.protocol("§12")
async def test_end_to_end_the_legacy_limit_text(tmp_path: Path) -> None:
    with trio.fail_after(20):
        turn, result, _ = await attempt(
            tmp_path, "reply", env=account_env(tmp_path, "old", limit="1771430400 legacy"))
    outcome = turn.finish(result)
    assert outcome is not None and outcome.error is not None
    assert outcome.error.startswith("Claude AI usage limit reached|1771430400")
    assert turn.limit is not None and turn.limit.resets_at == 1771430400


@pytest.mark.protocol("§12")
async def test_end_to_end_an_account_near_its_limit_warns_and_still_replies(
        tmp_path: Path) -> None:
    with trio.fail_after(20):
        turn, result, _ = await attempt(
            tmp_path, "reply", env=account_env(tmp_path, "busy", used_percent="41"))
    outcome = turn.finish(result)
    assert outcome is not None and outcome.ok and outcome.reply == "Hello from the fake Claude."
    assert turn.limit is not None and turn.limit.state == "warning"
    assert turn.limit.used_percent == pytest.approx(41.0)


@pytest.mark.protocol("§12")
async def test_end_to_end_an_account_without_limit_files_reports_nothing(tmp_path: Path) -> None:
    with trio.fail_after(20):
        turn, result, _ = await attempt(tmp_path, "reply", env=account_env(tmp_path, "free"))
    outcome = turn.finish(result)
    assert outcome is not None and outcome.ok and turn.limit is None


@pytest.mark.protocol("§12")
def test_a_run_at_its_budget_says_the_budget_and_the_spend_and_keeps_its_session() -> None:
    # §12: not retryable, with its session (the conversation goes on) and usage.
    turn = ClaudeBrain("claude -p", max_cost_usd=0.03).new_turn()
    feed_all(turn, INIT, result(None, subtype="error_max_budget_usd", is_error=True))
    outcome = turn.finish(process(1))
    assert outcome is not None and not outcome.ok and not outcome.retryable
    assert outcome.error == "the run reached its budget of $0.03 (it spent $0.0342)"
    assert outcome.session_id == SID
    assert outcome.usage is not None and outcome.usage.cost_usd == 0.0342


@pytest.mark.protocol("§7")
@pytest.mark.parametrize(("status", "retryable"), [(529, True), (500, True), (400, False),
                                                   (None, False)])
def test_an_api_failure_reported_as_success_with_is_error_is_a_failure(
    status: int | None, retryable: bool,
) -> None:
    # The CLI reports an API failure as subtype "success" with is_error true.
    turn = ClaudeTurn()
    feed_all(turn, INIT, result("API Error: 529 Overloaded", is_error=True,
                                api_error_status=status))
    outcome = turn.finish(process(1))
    assert outcome is not None and not outcome.ok and outcome.retryable is retryable
    assert outcome.error == "API Error: 529 Overloaded"


@pytest.mark.protocol("§12")
def test_the_budget_reaches_claude_code_as_max_budget_usd() -> None:
    brain = ClaudeBrain("claude -p", max_cost_usd=2.5)
    assert "--max-budget-usd=2.5" in brain.command(session_id=None, mcp=None)
    mine = ClaudeBrain("claude -p --max-budget-usd 1", max_cost_usd=2.5)
    assert mine.command(session_id=None, mcp=None).count("--max-budget-usd") == 1
    assert "--max-budget-usd" not in ClaudeBrain("claude -p").command(session_id=None, mcp=None)
