"""The Codex brain: its command lines, its reading of ``codex exec --json``, and real
attempts of the fake CLI (tests/agents/fake_codex.py) through the process runner."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from prohost.engine.agent.brains import brain_for
from prohost.engine.agent.brains.base import SUMMARY_CHARS, McpError, McpWiring
from prohost.engine.agent.brains.codex import CodexBrain, CodexTurn
from prohost.engine.agent.brains.codex_home import ROLLOUT_TAIL_BYTES, find_rollout
from prohost.engine.agent.environment import scratch_folder
from prohost.engine.agent.launch import Launch, ProcessLimits
from prohost.engine.agent.process import ProcessGroups, ProcessResult
from prohost.engine.agent.usage import from_codex_totals
from prohost.engine.run.execute import ExecSpec
from prohost.wire.runs import AgentRun, Mcp
from prohost.wire.timeline import ToolEvent
from tests.kits.output import Heard, run_agent
from tests.kits.paths import AGENTS, logs_folder
from tests.kits.runner import solo_runner

FAKE = AGENTS / "fake_codex.py"
FAKE_LINE = f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE))}"
THREAD = "0199a213-81c0-7800-8aa1-bbab2a035a53"
BYPASS = "--dangerously-bypass-approvals-and-sandbox"
ADDED = f"--json --skip-git-repo-check {BYPASS} -"
MIB = 1024 * 1024


# --- recorded lines ---------------------------------------------------------

def line(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode()


def item(kind: str, **fields: Any) -> bytes:
    return line({"type": kind, "item": fields})


STARTED = line({"type": "thread.started", "thread_id": THREAD})
TURN_STARTED = b'{"type":"turn.started"}'
REASONING = item("item.completed", id="item_0", type="reasoning", text="**Planning**")
USAGE = {"input_tokens": 1200, "cached_input_tokens": 200, "output_tokens": 345}
COMPLETED = line({"type": "turn.completed", "usage": USAGE})
#: USAGE in the protocol's keys (§7): Codex's input_tokens count the cached ones.
RUN_USAGE = {"input_tokens": 1000, "output_tokens": 345, "cache_read_tokens": 200, "turns": 1}


def message(text: str, item_id: str = "item_9") -> bytes:
    return item("item.completed", id=item_id, type="agent_message", text=text)


def command(kind: str, item_id: str = "item_1", *, cmd: str = "/bin/bash -lc 'pytest -q'",
            output: str = "", exit_code: int | None = None, status: str = "in_progress") -> bytes:
    return item(kind, id=item_id, type="command_execution", command=cmd,
                aggregated_output=output, exit_code=exit_code, status=status)


def mcp_call(kind: str, status: str, error: dict[str, str] | None = None) -> bytes:
    return item(kind, id="item_2", type="mcp_tool_call", server="prohost", tool="post_message",
                arguments={"text": "hi"}, result=None, error=error, status=status)


def feed_all(turn: CodexTurn, *lines: bytes) -> list[ToolEvent]:
    events: list[ToolEvent] = []
    for raw in lines:
        events.extend(turn.feed(raw))
    return events


def ended(exit_code: int | None = 0, stderr: str = "", *, sig: int | None = None,
          overlong: int = 0) -> ProcessResult:
    return ProcessResult(exit_code=exit_code, signal=sig, stdout=b"", stdout_truncated=False,
                         last_stderr_line=stderr, timed_out=None, duration_s=1.0,
                         overlong_lines=overlong)


def states(events: list[ToolEvent]) -> list[tuple[str, str, str, str]]:
    return [(e.id, e.name, e.state, e.summary) for e in events]


# --- the parser ---------------------------------------------------------------

@pytest.mark.protocol("§5", "§7")
def test_a_plain_reply_with_its_thread_and_usage() -> None:
    turn = CodexTurn()
    assert feed_all(turn, STARTED, TURN_STARTED, REASONING, message("Done."), COMPLETED) == []
    assert turn.started and turn.session_id == THREAD
    outcome = turn.finish(ended(0))
    assert outcome is not None and outcome.ok
    assert outcome.reply == "Done."
    assert outcome.session_id == THREAD
    assert outcome.usage is not None and outcome.usage.to_json() == RUN_USAGE


@pytest.mark.protocol("§5")
def test_the_reply_is_the_last_agent_message() -> None:
    turn = CodexTurn()
    feed_all(turn, STARTED, message("Looking…", "item_1"),
             item("item.started", id="item_3", type="agent_message", text="Half"),
             message("Final answer.", "item_4"), COMPLETED)
    outcome = turn.finish(ended(0))
    assert outcome is not None and outcome.reply == "Final answer."


@pytest.mark.protocol("§8")
def test_a_command_is_called_then_done_or_error() -> None:
    turn = CodexTurn()
    events = feed_all(turn, STARTED, command("item.started"))
    assert states(events) == [("item_1", "Bash", "calling", "pytest -q")]
    assert turn.activity == "Bash: pytest -q"
    done = turn.feed(command("item.completed", output="3 passed\n", exit_code=0,
                             status="completed"))
    assert states(done) == [("item_1", "Bash", "done", "pytest -q")]
    assert turn.activity == "thinking"
    failed = turn.feed(command("item.completed", "item_5", cmd="make", exit_code=2,
                               status="failed"))
    assert states(failed) == [("item_5", "Bash", "error", "make")]
    # A non-zero exit is an error even if a status says otherwise, and a command the
    # policy declined never ran.
    assert turn.feed(command("item.completed", exit_code=1, status="completed"))[0].state == "error"
    assert turn.feed(command("item.completed", status="declined"))[0].state == "error"


@pytest.mark.protocol("§2")
def test_activity_is_the_latest_tool_still_running() -> None:
    turn = CodexTurn()
    turn.feed(command("item.started", "item_1", cmd="make test"))
    turn.feed(mcp_call("item.started", "in_progress"))
    assert turn.activity == "MCP: prohost.post_message"
    turn.feed(mcp_call("item.completed", "completed"))
    assert turn.activity == "Bash: make test"
    turn.feed(command("item.completed", "item_1", cmd="make test", exit_code=0,
                      status="completed"))
    assert turn.activity == "thinking"
    turn.feed(COMPLETED)
    assert turn.activity is None


@pytest.mark.protocol("§8")
def test_a_long_or_multiline_command_is_one_short_line() -> None:
    turn = CodexTurn()
    script = "python - <<'EOF'\n" + "print('x')\n" * 100 + "EOF"
    [event] = turn.feed(command("item.started", cmd=shlex.join(["/bin/zsh", "-lc", script])))
    assert "\n" not in event.summary and len(event.summary) == SUMMARY_CHARS
    assert event.summary.startswith("python - <<'EOF' print('x')")
    assert event.summary.endswith("…")
    # A command not wrapped in a shell is shown as Codex gave it.
    [plain] = turn.feed(command("item.started", cmd="git status --short"))
    assert plain.summary == "git status --short"


@pytest.mark.protocol("§8")
def test_mcp_tool_calls() -> None:
    turn = CodexTurn()
    events = feed_all(turn, mcp_call("item.started", "in_progress"),
                      mcp_call("item.completed", "completed"),
                      mcp_call("item.completed", "failed", {"message": "timed out"}))
    assert states(events) == [
        ("item_2", "MCP", "calling", "prohost.post_message"),
        ("item_2", "MCP", "done", "prohost.post_message"),
        ("item_2", "MCP", "error", "prohost.post_message"),
    ]
    assert turn.activity == "thinking"


@pytest.mark.protocol("§8")
def test_file_changes_name_their_paths() -> None:
    turn = CodexTurn()
    changes = [{"path": "/w/src/app.py", "kind": "update"}, {"path": "/w/NEW.md", "kind": "add"}]
    # Older Codex emits a file change only once it is applied.
    [done] = turn.feed(item("item.completed", id="item_3", type="file_change",
                            changes=changes, status="completed"))
    assert (done.name, done.state, done.summary) == ("Edit", "done", "/w/src/app.py, /w/NEW.md")
    assert turn.activity == "thinking"
    [failed] = turn.feed(item("item.completed", id="item_4", type="file_change",
                              changes=changes[:1], status="failed"))
    assert (failed.state, failed.summary) == ("error", "/w/src/app.py")


@pytest.mark.protocol("§8")
def test_web_searches_show_their_query() -> None:
    turn = CodexTurn()
    [started] = turn.feed(item("item.started", id="item_5", type="web_search", query="",
                               action={"type": "search", "query": "trio fail_after"}))
    [done] = turn.feed(item("item.completed", id="item_5", type="web_search",
                            query="trio fail_after docs"))
    assert states([started, done]) == [
        ("item_5", "WebSearch", "calling", "trio fail_after"),
        ("item_5", "WebSearch", "done", "trio fail_after docs"),
    ]


@pytest.mark.protocol("§5")
def test_unknown_and_quiet_kinds_are_ignored() -> None:
    turn = CodexTurn()
    quiet = [
        item("item.started", id="item_6", type="todo_list",
             items=[{"text": "read the code", "completed": False}]),
        item("item.updated", id="item_6", type="todo_list",
             items=[{"text": "read the code", "completed": True}]),
        item("item.completed", id="item_7", type="error", message="model rerouted"),
        item("item.completed", id="item_8", type="collab_tool_call", tool="spawn_agent"),
        item("item.completed", id="item_9", type="hologram", beam=True),
        item("item.updated", id="item_1", type="command_execution", command="ls",
             aggregated_output="a", exit_code=None, status="in_progress"),
        line({"type": "item.plan.delta", "item_id": "item_1", "delta": "step"}),
        line({"type": "request_user_input", "id": "t", "call_id": "c", "questions": []}),
        line({"type": "session.teleported", "where": "mars"}),
        line({"no_type": True}),
    ]
    assert feed_all(turn, STARTED, *quiet) == []
    assert turn.activity is None and turn.reply is None


@pytest.mark.protocol("§5")
@pytest.mark.parametrize("raw", [
    b"", b"   ", b"not json", b"Reading prompt from stdin...", b"[1, 2]", b"{not json",
    b'"a string"', b"\xff\xfe{\x00", b'{"type":"item.completed","item":"text"}',
    b'{"type":"item.completed","item":{"type":"command_execution","command":5,"id":7}}',
    b'{"type":"item.started","item":{"type":"file_change","changes":[1,null,{"path":3}]}}',
    b'{"type":"item.completed","item":{"type":"agent_message","text":null}}',
    b'{"type":"thread.started","thread_id":null}',
    b'{"type":"turn.completed","usage":[1]}', b'{"type":"turn.failed","error":"boom"}',
    b'{"type":"error","message":{"nested":1}}', b'{"type":7}',
])
def test_garbage_never_raises(raw: bytes) -> None:
    turn = CodexTurn()
    turn.feed(raw)
    assert turn.reply is None and turn.session_id is None


@pytest.mark.protocol("§5")
def test_a_five_mebibyte_line() -> None:
    turn = CodexTurn()
    huge = command("item.completed", output="x" * (5 * MIB), exit_code=0, status="completed")
    assert len(huge) > 5 * MIB
    assert states(turn.feed(huge)) == [("item_1", "Bash", "done", "pytest -q")]


# --- finish and resume_rejected ----------------------------------------------

@pytest.mark.protocol("§5")
def test_turn_failed_is_the_failure() -> None:
    turn = CodexTurn()
    feed_all(turn, STARTED, line({"type": "error", "message": "Reconnecting... 1/5"}),
             message("partial"),
             line({"type": "turn.failed", "error": {"message": "You've hit your usage limit."}}))
    outcome = turn.finish(ended(1))
    assert outcome is not None and not outcome.ok
    assert outcome.error == ("You've hit your usage limit. (Codex usage limit reached;"
                             " it did not say when it resets)")
    assert turn.limit is not None and turn.limit.state == "limited"
    assert outcome.session_id == THREAD


@pytest.mark.protocol("§5")
def test_an_error_event_without_a_message_is_the_failure() -> None:
    turn = CodexTurn()
    feed_all(turn, STARTED, line({"type": "error", "message": "stream disconnected"}))
    outcome = turn.finish(ended(1, "some log line"))
    assert outcome is not None and outcome.error == "stream disconnected"
    assert outcome.session_id == THREAD


@pytest.mark.protocol("§5")
def test_a_transient_error_before_a_reply_does_not_fail_it() -> None:
    turn = CodexTurn()
    feed_all(turn, STARTED, line({"type": "error", "message": "Reconnecting... 1/5"}),
             message("Done."), COMPLETED)
    outcome = turn.finish(ended(0))
    assert outcome is not None and outcome.ok and outcome.reply == "Done."


@pytest.mark.protocol("§5")
def test_no_reply_after_a_process_failure_is_left_to_the_runner() -> None:
    turn = CodexTurn()
    turn.feed(STARTED)
    assert turn.finish(ended(1, "Error: boom")) is None
    assert turn.finish(ended(None, sig=9)) is None
    # A reply is not trusted from a process that then failed either.
    turn.feed(message("Done."))
    assert turn.finish(ended(3)) is None


@pytest.mark.protocol("§5")
def test_a_clean_exit_without_a_reply_is_a_failure() -> None:
    turn = CodexTurn()
    feed_all(turn, STARTED, TURN_STARTED, COMPLETED)
    outcome = turn.finish(ended(0))
    assert outcome is not None and not outcome.ok
    assert outcome.error is not None and "without a reply" in outcome.error
    assert outcome.session_id == THREAD
    skipped = CodexTurn().finish(ended(0, overlong=1))
    assert skipped is not None and skipped.error is not None and "over-long" in skipped.error


NO_ROLLOUT = ("Error: thread/resume: thread/resume failed: no rollout found for thread id "
              "abc (code -32600)")


@pytest.mark.protocol("§5")
def test_resume_rejected() -> None:
    assert CodexTurn().resume_rejected(ended(1, NO_ROLLOUT))
    assert CodexTurn().resume_rejected(ended(1, "No saved session found with ID abc."))
    # Any non-zero exit before the thread was announced: the resume failed.
    assert CodexTurn().resume_rejected(ended(1, "Error: something else"))
    assert not CodexTurn().resume_rejected(ended(0))
    assert not CodexTurn().resume_rejected(ended(None, sig=15))
    started = CodexTurn()
    started.feed(STARTED)
    assert not started.resume_rejected(ended(1, "Error: the model is overloaded"))
    assert started.resume_rejected(ended(1, NO_ROLLOUT))
    unloaded = CodexTurn()
    feed_all(unloaded, STARTED, line({"type": "error", "message": "thread not loaded: abc"}))
    assert unloaded.resume_rejected(ended(1))


# --- command lines ------------------------------------------------------------

@pytest.mark.protocol("§5")
def test_codex_gets_the_exec_subcommand() -> None:
    assert CodexBrain("codex").command(session_id=None, mcp=None) == f"codex exec {ADDED}"
    assert CodexBrain("codex exec").command(session_id=None, mcp=None) == f"codex exec {ADDED}"
    assert (CodexBrain("/opt/bin/codex").command(session_id=None, mcp=None)
            == f"/opt/bin/codex exec {ADDED}")


@pytest.mark.protocol("§5")
def test_the_users_words_are_kept_as_written() -> None:
    def cmd(line: str) -> str:
        return CodexBrain(line).command(session_id=None, mcp=None)

    assert cmd("FOO='a b' codex -m o3") == f"FOO='a b' codex exec -m o3 {ADDED}"
    assert cmd("codex -m o3 exec --color never") == f"codex -m o3 exec --color never {ADDED}"
    assert cmd("codex e") == f"codex e {ADDED}"
    assert cmd("$HOME/bin/codex -C ~/w") == f"$HOME/bin/codex exec -C ~/w {ADDED}"
    assert cmd("'/opt/my tools/codex'") == f"'/opt/my tools/codex' exec {ADDED}"
    # Not the codex program itself (a wrapper): taken as written, flags added.
    assert cmd("my-codex --profile ci") == f"my-codex --profile ci {ADDED}"


@pytest.mark.protocol("§5")
def test_flags_are_not_repeated() -> None:
    line = f"codex exec --json --skip-git-repo-check {BYPASS}"
    assert CodexBrain(line).command(session_id=None, mcp=None) == f"{line} -"
    assert CodexBrain("codex exec --yolo").command(session_id=None, mcp=None) == (
        "codex exec --yolo --json --skip-git-repo-check -")


@pytest.mark.protocol("§5")
def test_a_chosen_sandbox_and_safe_tools_are_honoured() -> None:
    assert BYPASS not in CodexBrain("codex", safe_tools=True).command(session_id=None, mcp=None)
    for line in ("codex --sandbox workspace-write", "codex -s read-only", "codex --full-auto"):
        assert BYPASS not in CodexBrain(line).command(session_id=None, mcp=None)


@pytest.mark.protocol("§5")
def test_later_turns_resume_the_thread() -> None:
    brain = CodexBrain("codex")
    assert brain.command(session_id=THREAD, mcp=None) == (
        f"codex exec --json --skip-git-repo-check {BYPASS} resume {THREAD} -")
    odd = brain.command(session_id="it's; rm -rf ~", mcp=None)
    assert shlex.split(odd)[-3:] == ["resume", "it's; rm -rf ~", "-"]
    # An id that would read as a flag is not passed: the turn starts fresh.
    assert "resume" not in brain.command(session_id="--last", mcp=None)


@pytest.mark.protocol("§5")
def test_mcp_wiring_goes_before_resume_and_is_quoted(tmp_path: Path) -> None:
    brain = CodexBrain("codex")
    wiring = brain.wire_mcp(Mcp(url="https://chat.example/mcp?x=1&y='2'", token="s3cret"),
                            tmp_path, {"CODEX_HOME": str(tmp_path / "codex")})
    words = shlex.split(brain.command(session_id=THREAD, mcp=wiring))
    assert words[-3:] == ["resume", THREAD, "-"]
    overrides = [words[i + 1] for i, word in enumerate(words) if word == "-c"]
    assert 'mcp_servers.prohost.url="https://chat.example/mcp?x=1&y=\'2\'"' in overrides
    assert "s3cret" not in " ".join(words)


def test_version_and_model() -> None:
    assert CodexBrain("/opt/bin/codex exec --json").version_command() == "/opt/bin/codex --version"
    assert CodexBrain("FOO=1 codex -m o3").version_command() == "FOO=1 codex --version"
    assert CodexBrain("codex -m o3").configured_model() == "o3"
    assert CodexBrain("codex exec -c 'model=\"gpt-5\"'").configured_model() == "gpt-5"
    assert CodexBrain("codex exec").configured_model() is None


def test_auto_picks_this_brain() -> None:
    brain = brain_for("auto", "/usr/local/bin/codex --model o3")
    assert isinstance(brain, CodexBrain)
    assert brain.name == "codex" and brain.streams


# --- wire_mcp -----------------------------------------------------------------

def override_value(wiring: McpWiring, key: str) -> Any:
    """The TOML value an override sets, parsed the way Codex parses it."""
    for arg in wiring.args:
        name, sep, raw = arg.partition("=")
        if sep and name == key:
            return tomllib.loads(f"v = {raw}")["v"]
    raise AssertionError(f"no override for {key}: {wiring.args}")


def test_wire_mcp_puts_the_token_in_a_private_overlay_of_codex_home(tmp_path: Path) -> None:
    url = 'https://chat.example/mcp/"run"\\x?q=\'é\''
    base = tmp_path / "codex-work"
    base.mkdir()
    (base / "auth.json").write_text('{"tokens": "login"}')
    (base / "config.toml").write_text('model = "o3"\n[projects."/src"]\ntrust_level = "trusted"')
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    wiring = CodexBrain("codex").wire_mcp(Mcp(url=url, token="tok-123"), folder,
                                          {"CODEX_HOME": str(base), "HOME": "/nonexistent"})
    assert override_value(wiring, "mcp_servers.prohost.url") == url
    assert not any("tok-123" in arg for arg in wiring.args)
    overlay = folder / "codex-home"
    # Only CODEX_HOME: the token is in no variable a child could inherit.
    assert dict(wiring.env) == {"CODEX_HOME": str(overlay)}
    assert stat.S_IMODE(overlay.stat().st_mode) == 0o700
    config = overlay / "config.toml"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600 and not config.is_symlink()
    parsed = tomllib.loads(config.read_text())
    assert parsed["model"] == "o3" and parsed["projects"]["/src"]["trust_level"] == "trusted"
    assert parsed["mcp_servers"]["prohost"] == {
        "url": url, "http_headers": {"Authorization": "Bearer tok-123"}}
    # Everything else is the real home, through links: the login, and the folders
    # Codex keeps threads and logs in (made there first).
    assert sorted(p.name for p in overlay.iterdir()) == [
        "auth.json", "config.toml", "log", "sessions"]
    for name in ("auth.json", "log", "sessions"):
        assert (overlay / name).is_symlink()
        assert (overlay / name).resolve() == (base / name).resolve()
    assert (base / "sessions").is_dir() and "tok-123" not in (base / "config.toml").read_text()


def test_the_overlay_without_codex_home_is_over_the_users_codex_folder(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    wiring = CodexBrain("codex").wire_mcp(Mcp(url="https://x/mcp", token="t"), folder,
                                          {"HOME": str(tmp_path / "user")})
    assert (folder / "codex-home" / "sessions").resolve() == tmp_path / "user/.codex/sessions"
    assert tomllib.loads((folder / "codex-home/config.toml").read_text())["mcp_servers"]
    assert wiring.env["CODEX_HOME"] == str(folder / "codex-home")


def test_a_users_own_prohost_mcp_server_is_refused_not_duplicated(tmp_path: Path) -> None:
    base = tmp_path / "codex"
    base.mkdir()
    (base / "config.toml").write_text('[mcp_servers.prohost]\nurl = "http://mine"\n')
    (tmp_path / "run").mkdir()
    with pytest.raises(McpError, match=r"already defines \[mcp_servers.prohost\]"):
        CodexBrain("codex").wire_mcp(Mcp(url="https://x/mcp", token="t"), tmp_path / "run",
                                     {"CODEX_HOME": str(base)})


def test_wire_mcp_without_a_token(tmp_path: Path) -> None:
    wiring = CodexBrain("codex").wire_mcp(Mcp(url="http://127.0.0.1:8080/mcp"), tmp_path)
    assert override_value(wiring, "mcp_servers.prohost.url") == "http://127.0.0.1:8080/mcp"
    assert not any("bearer_token_env_var" in arg for arg in wiring.args)
    assert dict(wiring.env) == {}


@pytest.mark.parametrize("url", [
    "ftp://chat.example/mcp", "file:///tmp/mcp.sock", "localhost:8080/mcp", "/mcp",
    "http:///no-host", "ws://chat.example/mcp",
])
def test_wire_mcp_refuses_what_is_not_http(tmp_path: Path, url: str) -> None:
    with pytest.raises(McpError, match="http:// or https://") as caught:
        CodexBrain("codex").wire_mcp(Mcp(url=url, token="t"), tmp_path)
    assert url not in str(caught.value)


@pytest.mark.parametrize(("url", "token", "why"), [
    ("https://chat.example/m cp", None, "spaces or control"),
    ("https://chat.example/mcp\n", None, "spaces or control"),
    ("https://chat.example/m\x7fcp", None, "spaces or control"),
    ("https://chat.example/mcp", "tok\r\nX-Evil: 1", "HTTP header"),
    ("https://chat.example/mcp", "tok\0", "HTTP header"),
])
def test_wire_mcp_refuses_what_codex_could_not_send(
    tmp_path: Path, url: str, token: str | None, why: str,
) -> None:
    with pytest.raises(McpError, match=why):
        CodexBrain("codex").wire_mcp(Mcp(url=url, token=token), tmp_path)


# --- real attempts through the process runner ---------------------------------

@pytest.fixture
def groups() -> Iterator[ProcessGroups]:
    groups = ProcessGroups()
    groups.grace_s = 0.5
    yield groups
    assert len(groups) == 0


def fake_env(tmp_path: Path, scenario: str, **extra: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "FAKE_CODEX_SCENARIO": scenario,
        "FAKE_CODEX_RECORD": str(logs_folder(tmp_path) / "record.json"),
        "PROHOST_RUN_ID": "run_01",
        "PROHOST_PAIRED_RUN": "1",
        **extra,
    }


def recorded(tmp_path: Path) -> dict[str, Any]:
    # The last invocation's entry.
    data: dict[str, Any] = json.loads((logs_folder(tmp_path) / "record.json").read_text())[-1]
    return data


async def attempt(brain: CodexBrain, tmp_path: Path, groups: ProcessGroups, scenario: str, *,
                  session_id: str | None = None, mcp: McpWiring | None = None,
                  deadline: float = float("inf"), extra_env: dict[str, str] | None = None,
                  ) -> tuple[CodexTurn, ProcessResult, list[ToolEvent]]:
    turn = brain.new_turn()
    assert isinstance(turn, CodexTurn)
    events: list[ToolEvent] = []
    env = fake_env(tmp_path, scenario, **(dict(mcp.env) if mcp else {}), **(extra_env or {}))
    result = await run_agent(
        Launch(command=brain.command(session_id=session_id, mcp=mcp),
               stdin_text="Fix the build, please.", cwd=tmp_path, env=env),
        groups, ProcessLimits(deadline=deadline),
        Heard(on_line=lambda raw: events.extend(turn.feed(raw))),
    )
    return turn, result, events


@pytest.mark.protocol("§5", "§7")
async def test_end_to_end_reply(tmp_path: Path, groups: ProcessGroups) -> None:
    with trio.fail_after(20):
        turn, result, events = await attempt(CodexBrain(FAKE_LINE), tmp_path, groups, "reply")
    outcome = turn.finish(result)
    assert outcome is not None and outcome.ok
    assert outcome.reply == "Fixed: the fixture path was wrong."
    assert outcome.session_id == THREAD and outcome.usage is not None
    assert outcome.usage.to_json() == RUN_USAGE
    assert events == []
    record = recorded(tmp_path)
    assert record["argv"] == ["--json", "--skip-git-repo-check", BYPASS, "-"]
    assert record["prompt"] == "Fix the build, please."
    assert record["env"]["PROHOST_RUN_ID"] == "run_01"


@pytest.mark.protocol("§5", "§8")
async def test_end_to_end_tool_and_noise(tmp_path: Path, groups: ProcessGroups) -> None:
    with trio.fail_after(20):
        turn, result, events = await attempt(CodexBrain(FAKE_LINE), tmp_path, groups, "tool")
        noisy, noisy_result, _ = await attempt(CodexBrain(FAKE_LINE), tmp_path, groups, "noise")
    assert states(events) == [("item_0", "Bash", "calling", "pytest -q"),
                              ("item_0", "Bash", "done", "pytest -q")]
    assert turn.activity is None  # the turn is over
    outcome = turn.finish(result)
    assert outcome is not None and outcome.ok and outcome.reply
    noisy_outcome = noisy.finish(noisy_result)
    assert noisy_outcome is not None and noisy_outcome.ok
    assert noisy_outcome.reply == "Fixed: the fixture path was wrong."


@pytest.mark.protocol("§5")
async def test_end_to_end_huge_line(tmp_path: Path, groups: ProcessGroups) -> None:
    with trio.fail_after(30):
        turn, result, events = await attempt(CodexBrain(FAKE_LINE), tmp_path, groups,
                                             "huge_line")
    assert result.overlong_lines == 0
    assert [event.state for event in events] == ["calling", "done"]
    outcome = turn.finish(result)
    assert outcome is not None and outcome.ok and outcome.reply


@pytest.mark.protocol("§5")
async def test_end_to_end_turn_failed(tmp_path: Path, groups: ProcessGroups) -> None:
    with trio.fail_after(20):
        turn, result, _ = await attempt(CodexBrain(FAKE_LINE), tmp_path, groups, "failed",
                                        session_id=THREAD)
    assert result.exit_code == 1
    assert not turn.resume_rejected(result)  # the thread was there; the turn failed
    outcome = turn.finish(result)
    assert outcome is not None and not outcome.ok
    assert outcome.error == ("You've hit your usage limit. Try again later. (Codex usage limit"
                             " reached; it did not say when it resets)")
    assert outcome.session_id == THREAD


@pytest.mark.protocol("§5")
async def test_end_to_end_unknown_thread_then_fresh(tmp_path: Path,
                                                    groups: ProcessGroups) -> None:
    brain = CodexBrain(FAKE_LINE)
    with trio.fail_after(20):
        turn, result, _ = await attempt(brain, tmp_path, groups, "no_rollout",
                                        session_id="stale-thread")
        assert recorded(tmp_path)["argv"][-3:] == ["resume", "stale-thread", "-"]
        assert turn.resume_rejected(result)
        assert "no rollout found" in result.last_stderr_line
        assert turn.finish(result) is None and turn.session_id is None
        # What the runner does next: the same request in a fresh thread.
        fresh, fresh_result, _ = await attempt(brain, tmp_path, groups, "no_rollout")
    outcome = fresh.finish(fresh_result)
    assert outcome is not None and outcome.ok and outcome.session_id == THREAD


@pytest.mark.protocol("§5")
async def test_errors_forever_stop_at_the_deadline(tmp_path: Path,
                                                   groups: ProcessGroups) -> None:
    with trio.fail_after(20):
        turn, result, events = await attempt(CodexBrain(FAKE_LINE), tmp_path, groups,
                                             "errors_forever",
                                             deadline=trio.current_time() + 1)
    assert result.timed_out == "total"
    assert "stream error" in result.last_stderr_line
    assert events == [] and turn.session_id is None and not turn.started
    assert not turn.resume_rejected(result)  # stopped by us, not by codex


@pytest.fixture
def codex_on_disk(tmp_path: Path) -> Path:
    """A program really named ``codex`` (so the brain inserts ``exec``) running the fake."""
    script = tmp_path / "bin" / "codex"
    script.parent.mkdir()
    script.write_text(f"#!/bin/sh\nexec {FAKE_LINE} \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


@pytest.mark.protocol("§5")
async def test_end_to_end_codex_program_with_mcp_resumes_through_the_overlay(
        tmp_path: Path, groups: ProcessGroups, codex_on_disk: Path) -> None:
    """Two turns, each with its own overlay (removed after it, as after a run): the
    first thread is kept in the real CODEX_HOME, so the second resumes it."""
    brain = CodexBrain(shlex.quote(str(codex_on_disk)))
    base = tmp_path / "codex-home"
    mcp = Mcp(url="https://chat.example/mcp", token="tok-e2e")
    threads = []
    for turn_number in (1, 2):
        folder = tmp_path / f"run-{turn_number}"
        folder.mkdir(mode=0o700)
        wiring = brain.wire_mcp(mcp, folder, {"CODEX_HOME": str(base)})
        with trio.fail_after(20):
            turn, result, _ = await attempt(
                brain, tmp_path, groups, "reply", mcp=wiring,
                session_id=threads[-1] if threads else None)
        outcome = turn.finish(result)
        assert outcome is not None and outcome.ok, result
        assert outcome.session_id is not None
        threads.append(outcome.session_id)
        record = recorded(tmp_path)
        argv = record["argv"]
        assert argv[:4] == ["exec", "--json", "--skip-git-repo-check", BYPASS]
        assert 'mcp_servers.prohost.url="https://chat.example/mcp"' in argv
        assert "tok-e2e" not in " ".join(argv)
        assert record["mcp_server"] == {"url": "https://chat.example/mcp",
                                        "http_headers": {"Authorization": "Bearer tok-e2e"}}
        assert record["codex_home"] == str(folder / "codex-home")
        assert record["env"]["PROHOST_MCP_TOKEN"] is None
        shutil.rmtree(folder)
    assert argv[-3:] == ["resume", threads[0], "-"]
    assert threads[1] == threads[0]
    assert find_rollout(base, threads[0]) is not None
    assert brain.version_command() == f"{shlex.quote(str(codex_on_disk))} --version"


@pytest.mark.protocol("§5")
async def test_through_execute_a_stale_thread_is_retried_fresh(
    tmp_path: Path, groups: ProcessGroups, codex_on_disk: Path,
) -> None:
    """The runner's view: a lane's stale thread, the MCP wiring, one fresh retry."""
    run = AgentRun(run_id="run_01", completion_path="/runs/run_01/complete", text="Fix it",
                   mcp=Mcp(url="https://chat.example/mcp", token="tok-x"))
    spec = ExecSpec(command=str(codex_on_disk), workdir=tmp_path / "work", timeout_s=0,
                    idle_timeout_s=0, parallel=False, secrets=())
    base = tmp_path / "codex-home"
    base_env = fake_env(tmp_path, "reply", CODEX_HOME=str(base))
    with trio.fail_after(20):
        async with solo_runner(tmp_path / "solo", spec, CodexBrain(str(codex_on_disk)),
                               groups=groups, env=base_env,
                               scratch_root=tmp_path / "runs") as solo:
            outcome = await solo.outcome(run, session_id="stale-thread")
    assert outcome.ok and outcome.reply == "Fixed: the fixture path was wrong."
    assert outcome.session_id is not None
    assert find_rollout(base, outcome.session_id) is not None
    record = recorded(tmp_path)
    assert "resume" not in record["argv"]
    assert record["env"] == {"PROHOST_RUN_ID": "run_01", "PROHOST_PAIRED_RUN": "1",
                             "PROHOST_MCP_TOKEN": None}
    assert record["mcp_server"]["http_headers"] == {"Authorization": "Bearer tok-x"}
    assert "Fix it" in record["prompt"]
    # The overlay went with the run's scratch folder; the real home is whole.
    assert not scratch_folder(tmp_path / "runs", "run_01").exists()
    assert "tok-x" not in "".join(p.read_text() for p in base.rglob("*") if p.is_file())


# --- usage limits ------------------------------------------------------------------

#: 2026-02-18 12:00 UTC, the moment "Try again at 1:05 PM" is read against.
NOON = 1771416000.0


@pytest.mark.protocol("§12")
def test_a_usage_limit_error_marks_the_turn_limited_until_its_time() -> None:
    turn = CodexTurn(clock=lambda: NOON)
    said = "You've hit your usage limit. Try again at Feb 18th, 2026 1:05 PM (UTC)."
    feed_all(turn, STARTED, line({"type": "turn.started"}),
             line({"type": "error", "message": said}),
             line({"type": "turn.failed", "error": {"message": said}}))
    outcome = turn.finish(ended(1))
    assert turn.limit is not None and turn.limit.state == "limited"
    assert turn.limit.resets_at == NOON + 65 * 60
    assert outcome is not None and not outcome.ok
    assert outcome.error == f"{said} (Codex usage limit reached; it resets at 2026-02-18 13:05 UTC)"


@pytest.mark.protocol("§12")
def test_a_transient_error_is_not_a_limit() -> None:
    turn = CodexTurn(clock=lambda: NOON)
    feed_all(turn, STARTED, line({"type": "error", "message": "Reconnecting... 1/5"}),
             message("done"), line({"type": "turn.completed", "usage": {}}))
    outcome = turn.finish(ended(0))
    assert outcome is not None and outcome.ok and turn.limit is None
    assert not turn.ended_by_limit(outcome)


@pytest.mark.protocol("§12")
@pytest.mark.parametrize("wrap", [
    # The protocol Event of older `codex exec --json`.
    lambda body: {"id": "0", "msg": body},
    # A session rollout line.
    lambda body: {"timestamp": "2025-11-18T21:55:53.328Z", "type": "event_msg", "payload": body},
    lambda body: body,
])
def test_rate_limit_figures_in_a_token_count_event(wrap: Any) -> None:
    body = {"type": "token_count", "info": None, "rate_limits": {
        "primary": {"used_percent": 81.0, "window_minutes": 300, "resets_at": 1771430400},
        "secondary": {"used_percent": 12.0, "window_minutes": 10080, "resets_at": 1771900000}}}
    turn = CodexTurn(clock=lambda: NOON)
    feed_all(turn, STARTED, line(wrap(body)), message("ok"),
             line({"type": "turn.completed", "usage": {}}))
    outcome = turn.finish(ended(0))
    assert outcome is not None and outcome.ok and outcome.reply == "ok"
    assert turn.limit is not None and turn.limit.state == "warning"
    assert turn.limit.used_percent == 81.0 and turn.limit.resets_at == 1771430400


@pytest.mark.protocol("§12")
@pytest.mark.parametrize("raw", [
    b'{"type":"token_count","rate_limits":"full"}',
    b'{"id":"0","msg":{"type":"token_count","rate_limits":{"primary":[1]}}}',
    b'{"type":"event_msg","payload":{"type":"token_count"}}',
    b'{"type":"error","message":["You\'ve hit your usage limit"]}',
    b'{"type":"turn.failed","error":"You\'ve hit your usage limit"}',
])
def test_odd_limit_shapes_are_not_fatal(raw: bytes) -> None:
    turn = CodexTurn(clock=lambda: NOON)
    assert turn.feed(raw) == []


@pytest.mark.protocol("§12")
async def test_end_to_end_a_limited_account_fails_with_its_reset(
        tmp_path: Path, groups: ProcessGroups) -> None:
    home = tmp_path / "personal"
    home.mkdir()
    # A whole minute (Codex prints minutes), a little ahead so it is read as coming.
    resets = (int(time.time()) // 60 + 90) * 60
    (home / "limit").write_text(f"{resets}\n")
    with trio.fail_after(20):
        turn, result, _ = await attempt(CodexBrain(FAKE_LINE), tmp_path, groups, "reply",
                                        extra_env={"CODEX_HOME": str(home)})
    assert result.exit_code == 1
    outcome = turn.finish(result)
    assert outcome is not None and not outcome.ok and outcome.error is not None
    assert outcome.error.startswith("You've hit your usage limit. Try again at ")
    assert "Codex usage limit reached; it resets at" in outcome.error
    assert turn.limit is not None and turn.limit.state == "limited"
    assert turn.limit.resets_at == resets
    assert turn.ended_by_limit(outcome) and not turn.resume_rejected(result)
    assert recorded(tmp_path)["codex_home"] == str(home)


@pytest.mark.protocol("§12")
async def test_end_to_end_an_account_near_its_limit_still_replies(
        tmp_path: Path, groups: ProcessGroups) -> None:
    home = tmp_path / "work"
    home.mkdir()
    (home / "used_percent").write_text("92")
    with trio.fail_after(20):
        turn, result, _ = await attempt(CodexBrain(FAKE_LINE), tmp_path, groups, "reply",
                                        extra_env={"CODEX_HOME": str(home)})
    outcome = turn.finish(result)
    assert outcome is not None and outcome.ok
    assert turn.limit is not None and turn.limit.state == "warning"
    assert turn.limit.used_percent == 92.0


@pytest.mark.protocol("§7")
def test_a_resumed_threads_run_reports_its_own_share_of_the_totals() -> None:
    # turn.completed carries the thread's running totals (openai/codex #17539).
    turn = CodexTurn()
    turn.usage_before = from_codex_totals({"input_tokens": 700, "cached_input_tokens": 100,
                                           "output_tokens": 45})
    feed_all(turn, STARTED, TURN_STARTED, message("Done."), COMPLETED)
    outcome = turn.finish(ended(0))
    assert outcome is not None and outcome.usage is not None and outcome.usage.to_json() == {
        "input_tokens": 400, "output_tokens": 300, "cache_read_tokens": 100, "turns": 1}
    totals = turn.session_totals()
    assert totals is not None and totals.to_json() == {
        "input_tokens": 1000, "output_tokens": 345, "cache_read_tokens": 200}


# -- the session rollout file (issue 28 point 8) -------------------------------------

THREAD = "0199a213-81c0-7800-8aa1-bbab2a035a53"


def token_count(input_tokens: int, cached: int, output: int) -> str:
    """A rollout line of ``EventMsg::TokenCount`` as codex writes it (see
    :func:`prohost.engine.agent.usage.from_codex_rollout_line`)."""
    usage = {"input_tokens": input_tokens, "cached_input_tokens": cached,
             "output_tokens": output, "reasoning_output_tokens": 0,
             "total_tokens": input_tokens + output}
    return json.dumps({"timestamp": "2025-10-28T12:00:03.120Z", "type": "event_msg",
                       "payload": {"type": "token_count", "info": {
                           "total_token_usage": usage, "last_token_usage": usage,
                           "model_context_window": 272000}, "rate_limits": None}})


def write_rollout(home: Path, *lines: str, day: str = "2025/10/28") -> Path:
    folder = home / "sessions" / day
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"rollout-{day.replace('/', '-')}T12-00-00-{THREAD}.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.mark.protocol("§7")
def test_the_rollout_files_last_token_count_is_the_threads_totals(tmp_path: Path) -> None:
    meta = json.dumps({"timestamp": "2025-10-28T12:00:00.000Z", "type": "session_meta",
                       "payload": {"id": THREAD, "cwd": "/w"}})
    no_info = json.dumps({"timestamp": "t", "type": "event_msg", "payload": {
        "type": "token_count", "info": None, "rate_limits": None}})
    message = json.dumps({"timestamp": "t", "type": "event_msg", "payload": {
        "type": "agent_message", "message": "token_count"}})
    write_rollout(tmp_path, meta, token_count(1200, 200, 345), token_count(2400, 400, 690),
                  no_info, message, "{not json")
    brain = CodexBrain("codex")
    totals = brain.recorded_totals(THREAD, {"CODEX_HOME": str(tmp_path)})
    assert totals == from_codex_totals({"input_tokens": 2400, "cached_input_tokens": 400,
                                        "output_tokens": 690})
    # Another day's file of the same thread (resumed later): the newest folder wins.
    write_rollout(tmp_path, meta, token_count(3600, 600, 1035), day="2025/11/02")
    assert brain.recorded_totals(THREAD, {"CODEX_HOME": str(tmp_path)}) == \
        from_codex_totals({"input_tokens": 3600, "cached_input_tokens": 600,
                           "output_tokens": 1035})


@pytest.mark.protocol("§7")
def test_only_the_rollout_files_tail_is_read(tmp_path: Path) -> None:
    big = json.dumps({"timestamp": "t", "type": "response_item", "payload": {
        "type": "function_call_output", "call_id": "c", "output": "x" * ROLLOUT_TAIL_BYTES}})
    write_rollout(tmp_path, token_count(1200, 200, 345), big)
    brain = CodexBrain("codex")
    env = {"CODEX_HOME": str(tmp_path)}
    assert brain.recorded_totals(THREAD, env) is None  # beyond the tail: not known
    # A count cut at the tail's start is not read as a count.
    line = token_count(1200, 200, 345)
    write_rollout(tmp_path, line, "y" * (ROLLOUT_TAIL_BYTES - len(line) // 2))
    assert brain.recorded_totals(THREAD, env) is None


@pytest.mark.protocol("§7")
def test_no_rollout_file_or_an_odd_thread_id_is_not_known(tmp_path: Path) -> None:
    brain = CodexBrain("codex")
    env = {"CODEX_HOME": str(tmp_path)}
    assert brain.recorded_totals(THREAD, env) is None
    write_rollout(tmp_path, token_count(1200, 200, 345))
    assert brain.recorded_totals("*", env) is None
    assert brain.recorded_totals("../" + THREAD, env) is None
