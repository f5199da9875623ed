"""Real ACP agents through the harness, against a mock model on 127.0.0.1.

Claude Code (``@agentclientprotocol/claude-agent-acp``), Codex
(``@zed-industries/codex-acp``), Gemini CLI (``@google/gemini-cli``, ``gemini
--acp``), Qwen Code (``@qwen-code/qwen-code``, ``qwen --acp``) and OpenCode
(``opencode-ai``, ``opencode acp``) are installed by ``.ci/run`` with npm into
``$PROHOST_REAL_CLIS`` and pointed at :class:`tests.kits.mock_models.MockModel` by
their documented settings (``ANTHROPIC_BASE_URL``; a ``model_providers`` entry in
``CODEX_HOME/config.toml``; ``GOOGLE_GEMINI_BASE_URL`` with an API key;
``QWEN_DEFAULT_AUTH_TYPE=openai`` with ``OPENAI_BASE_URL``; a provider in
``~/.config/opencode/opencode.json``). Each is driven by ``--brain auto``
(its command line must be recognised as ACP) through two turns of one
conversation, the second in the first's session (the model must see the first
turn again: Gemini CLI's too, whose saved session the harness keeps loadable),
a cancel while the model is answering (which the agent itself must answer
``cancelled``), each turn's reply exactly and its usage as the mock model
made it; a turn where the mock model calls the agent's shell tool with a command
that makes a file, which each agent asks permission for and the brain grants, and
with ``--safe-tools`` refuses (the turn goes on where the agent allows); Gemini CLI
with only its key, turn after turn; codex-acp with only ``OPENAI_API_KEY``.
Without the installed agents the tests skip and say why.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.kits.asgi import serving
from tests.kits.harness import finished, released, running_harness, running_server
from tests.kits.mock_models import TOOL_WORD, MockModel

pytestmark = pytest.mark.protocol("§5", "§6")

CLI_ROOT = Path(os.environ.get("PROHOST_REAL_CLIS", ".cache/agent-clis")).resolve()
CLI_DIR = CLI_ROOT / "node_modules" / ".bin"
REPLY = "Hello from the mock model."

#: The agent's program in CLI_DIR and the rest of its ACP command line.
AGENTS = {
    "claude": ("claude-agent-acp", ""),
    "codex": ("codex-acp", ""),
    # A named model: "auto" would first ask a routing model for a JSON verdict.
    "gemini": ("gemini", " --acp -m gemini-2.5-flash"),
    "qwen": ("qwen", " --acp"),
    "opencode": ("opencode", " acp"),
}


def installed(agent: str) -> pytest.MarkDecorator:
    """Skip unless ``agent``'s program is installed, saying so: decided before trio
    starts, as a skip raised inside it would lose its reason."""
    program = AGENTS[agent][0]
    return pytest.mark.skipif(
        not (CLI_DIR / program).exists(),
        reason=f"{program} is not installed in {CLI_DIR} (.ci/run installs it with npm; "
               "npm was missing or offline)")


#: Every agent, each test skipped (and saying why) where it is not installed.
EVERY_AGENT = [pytest.param(agent, marks=installed(agent)) for agent in sorted(AGENTS)]


def setup_for(agent: str, url: str, home: Path) -> tuple[str, dict[str, str]]:
    """The ``--exec`` line and the environment that point ``agent`` at ``url``."""
    program, rest = AGENTS[agent]
    path = CLI_DIR / program
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("ANTHROPIC_", "OPENAI_", "CLAUDE", "CODEX", "GEMINI",
                                  "GOOGLE_"))}
    user = home / "user-home"
    user.mkdir(parents=True)
    env["HOME"] = str(user)
    if agent == "claude":
        # IS_SANDBOX: CI containers run as root, where Claude Code refuses to start
        # its sessions (the adapter allows its bypass mode) unless told it is in a
        # sandbox.
        env.update(ANTHROPIC_BASE_URL=url, ANTHROPIC_API_KEY="mock-key", IS_SANDBOX="1")
    elif agent == "codex":
        codex_home = home / "codex-home"
        codex_home.mkdir()
        (codex_home / "config.toml").write_text(
            'model = "mock-model"\nmodel_provider = "mock"\n'
            "[model_providers.mock]\n"
            f'name = "mock"\nbase_url = "{url}/v1"\nwire_api = "responses"\n'
            'env_key = "MOCK_API_KEY"\n')
        env.update(CODEX_HOME=str(codex_home), MOCK_API_KEY="mock-key")
    elif agent == "opencode":
        # OpenCode's documented custom provider (an OpenAI-compatible endpoint),
        # with its shell tool set to ask first. It fetches the provider's npm
        # package at its first start: the registry .ci/run installed it from.
        config = user / ".config" / "opencode"
        config.mkdir(parents=True)
        (config / "opencode.json").write_text(json.dumps({
            "provider": {"mock": {"npm": "@ai-sdk/openai-compatible", "name": "Mock",
                                  "options": {"baseURL": f"{url}/v1", "apiKey": "mock-key"},
                                  "models": {"mock-model": {"name": "Mock"}}}},
            "model": "mock/mock-model", "permission": {"bash": "ask"}}))
    elif agent == "qwen":
        # Qwen Code's documented OpenAI-compatible provider settings.
        env.update(QWEN_DEFAULT_AUTH_TYPE="openai", OPENAI_API_KEY="mock-key",
                   OPENAI_BASE_URL=f"{url}/v1", OPENAI_MODEL="mock-model")
    else:
        settings = user / ".gemini"
        settings.mkdir()
        (settings / "settings.json").write_text(json.dumps(
            {"security": {"auth": {"selectedType": "gemini-api-key"}}}))
        env.update(GOOGLE_GEMINI_BASE_URL=url, GEMINI_API_KEY="mock-key")
    return shlex.quote(str(path)) + rest, env


#: What each agent reports of a turn's tokens, for ``calls`` model calls of the
#: mock model (10 input and 5 output tokens each): ``None`` where its figures are
#: not §7's and are left out (prohost/engine/agent/brains/acp_usage.py; the
#: README's table).
def tokens_for(agent: str, calls: int) -> tuple[int, int] | None:
    if agent in ("claude", "qwen") or (agent == "opencode" and calls == 1):
        return (10 * calls, 5 * calls)
    return None  # codex: none on the wire; gemini: cached and thinking unsaid; opencode: last call


#: The model each agent names (``usage.model``).
MODELS = {"codex": None, "claude": None, "gemini": "gemini-2.5-flash", "qwen": "mock-model",
          "opencode": "mock/mock-model"}


def assert_usage(agent: str, completion: dict[str, Any], calls: int) -> None:
    usage = completion.get("usage") or {}
    expected = tokens_for(agent, calls)
    if expected is None:
        assert "input_tokens" not in usage and "output_tokens" not in usage, usage
    else:
        assert (usage.get("input_tokens"), usage.get("output_tokens")) == expected, usage
    if MODELS[agent] is not None:
        assert usage.get("model") == MODELS[agent], usage
    # Only the Claude Code adapter reports a cost (the mock's tokens at its price).
    assert ("cost_usd" in usage) == (agent == "claude"), usage


def asked_with(model: MockModel, words: str) -> Callable[[], bool]:
    return lambda: any(words in json.dumps(body) for _, body in model.requests)


@pytest.mark.parametrize("agent", EVERY_AGENT)
async def test_two_turns_share_a_session_and_a_cancel_stops_the_turn(
    tmp_path: Path, agent: str, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="prohost.brains.acp")
    model = MockModel(reply=REPLY)
    with trio.fail_after(240):
        async with serving(model) as url:
            exec_command, env = setup_for(agent, url, tmp_path)
            async with running_server() as server, running_harness(
                server, tmp_path / "home", exec_command=exec_command, env=env,
                timeout_s=120,
            ) as running:
                first = await server.submit_run("first turn: remember PELICAN",
                                                conversation_id="C1")
                await server.wait_until(finished(first))
                before = len(model.requests)
                second = await server.submit_run("second turn", conversation_id="C1")
                await server.wait_until(finished(second))
                one, two = (server.run(r).completion or {} for r in (first, second))
                assert one.get("ok") and two.get("ok"), (one, two)
                # The reply and nothing else (codex-acp's warnings are not part of it).
                assert one["reply"] == two["reply"] == REPLY, one
                assert_usage(agent, one, calls=1)
                assert_usage(agent, two, calls=1)
                assert one["session_id"] and two["session_id"]
                later = json.dumps([body for _, body in model.requests[before:]])
                assert "second turn" in later
                # The second turn's requests carry the first turn: the session was
                # really taken back, not only its id (Gemini CLI's too: the harness
                # renames its session's file before each load, acp_gemini.py).
                assert two["session_id"] == one["session_id"]
                assert "PELICAN" in later

                model.hold = trio.Event()
                third = await server.submit_run("third turn", conversation_id="C1")
                await model.held.wait()
                await server.cancel_run(third, "stop it")
                await server.wait_until(lambda state: state.runs[third].completion is not None)
                model.hold.set()
                cancelled = server.run(third).completion or {}
                assert cancelled["error"] == "cancelled: stop it"
                # The agent itself ended the turn as cancelled (its answer to the
                # prompt, or Qwen's error after our cancel), not only the signal.
                ended = [r.getMessage() for r in caplog.records
                         if "turn in session" in r.getMessage()]
                assert ended and ended[-1].endswith("ended: cancelled"), ended
                assert cancelled["session_id"]
                assert cancelled["session_id"] == one["session_id"]
                await released(running.harness, third)
                assert len(running.harness.groups) == 0


@pytest.mark.parametrize("agent", EVERY_AGENT)
async def test_a_permission_the_agent_asks_for_is_granted(tmp_path: Path, agent: str) -> None:
    model = MockModel(reply=REPLY)
    with trio.fail_after(180):
        async with serving(model) as url:
            exec_command, env = setup_for(agent, url, tmp_path)
            async with running_server() as server, running_harness(
                server, tmp_path / "home", exec_command=exec_command, env=env,
                timeout_s=120,
            ):
                run_id = await server.submit_run(f"please {TOOL_WORD}", conversation_id="C1")
                await server.wait_until(finished(run_id))
                completion = server.run(run_id).completion or {}
                assert completion.get("ok"), completion
                # The tool ran (its output went back to the model, its file is
                # there): a command that changes files is asked for, and allowed.
                assert asked_with(model, "mock-tool-ran")()
                assert (tmp_path / "home" / "workspace" / "made-by-the-tool").exists()
                timeline = server.run(run_id).timeline
                assert [e["state"] for e in timeline
                        if e["name"] != "Notice"] == ["calling", "done"], timeline
                assert completion["reply"] == REPLY, completion
                assert_usage(agent, completion, calls=2)


#: What a ``--safe-tools`` refusal of the mock's shell command leads to, read from
#: each agent: the turn goes on and the model answers (``None``), or the run ends
#: with this failure (said truly: codex-acp offers only ``abort`` for a command
#: asking to leave its sandbox; OpenCode ends its turn without a word).
SAFE_ENDINGS = {
    "claude": None, "gemini": None, "qwen": None,
    "codex": "offered no way to refuse and go on",
    "opencode": "ended its turn without a reply",
}


@pytest.mark.parametrize("agent", EVERY_AGENT)
async def test_safe_tools_refuse_the_tool_and_the_turn_goes_on_where_the_agent_allows(
    tmp_path: Path, agent: str,
) -> None:
    model = MockModel(reply=REPLY)
    with trio.fail_after(180):
        async with serving(model) as url:
            exec_command, env = setup_for(agent, url, tmp_path)
            async with running_server() as server, running_harness(
                server, tmp_path / "home", exec_command=exec_command, env=env,
                timeout_s=120, safe_tools=True,
            ):
                run_id = await server.submit_run(f"please {TOOL_WORD}", conversation_id="C1")
                await server.wait_until(finished(run_id))
                completion = server.run(run_id).completion or {}
                # Refused: the command never ran (its file is not there).
                assert not (tmp_path / "home" / "workspace" / "made-by-the-tool").exists()
                ending = SAFE_ENDINGS[agent]
                if ending is None:
                    assert completion.get("ok") and completion["reply"] == REPLY, completion
                else:
                    assert not completion.get("ok") and ending in completion["error"], completion
                timeline = [e for e in server.run(run_id).timeline if e["name"] != "Notice"]
                assert timeline and timeline[-1]["state"] == "error", timeline


@installed("gemini")
async def test_gemini_with_only_its_key_answers_turn_after_turn_in_one_session(
    tmp_path: Path,
) -> None:
    """No saved login setting, only ``GEMINI_API_KEY``: every turn is answered in
    the first turn's session, the model seeing the earlier turns again. Three turns
    within a minute or two: the second loads the session in the minute it was
    started, the third after a load's leftovers were cleaned up at Gemini's start
    (each of which erased the session before the harness renamed its file)."""
    model = MockModel(reply=REPLY)
    with trio.fail_after(180):
        async with serving(model) as url:
            exec_command, env = setup_for("gemini", url, tmp_path)
            (Path(env["HOME"]) / ".gemini" / "settings.json").unlink()
            async with running_server() as server, running_harness(
                server, tmp_path / "home", exec_command=exec_command, env=env, timeout_s=120,
            ):
                runs, asked = [], []
                for text in ("first turn: remember PELICAN", "second turn: remember OSTRICH",
                             "third turn"):
                    before = len(model.requests)
                    runs.append(await server.submit_run(text, conversation_id="C1"))
                    await server.wait_until(finished(runs[-1]))
                    asked.append(json.dumps([body for _, body in model.requests[before:]]))
                done = [server.run(r).completion or {} for r in runs]
                assert all(c.get("ok") and c["reply"] == REPLY for c in done), done
                assert len({c["session_id"] for c in done}) == 1, done
                assert "PELICAN" in asked[1] and "PELICAN" in asked[2], asked
                assert "OSTRICH" in asked[2], asked[2]
                said = [e["summary"] for r in runs for e in server.run(r).timeline
                        if e["name"] == "Notice"]
                assert said == [], said


@installed("codex")
async def test_codex_with_only_openai_api_key_is_logged_in_with_it(tmp_path: Path) -> None:
    """codex-acp reads ``OPENAI_API_KEY`` only once told to (``authenticate`` with its
    "openai-api-key" method): a provider that needs OpenAI's login gets the key."""
    model = MockModel(reply=REPLY)
    with trio.fail_after(180):
        async with serving(model) as url:
            exec_command, env = setup_for("codex", url, tmp_path)
            # Codex's own OpenAI provider (no provider of ours), pointed at the mock.
            (Path(env["CODEX_HOME"]) / "config.toml").write_text(
                f'model = "mock-model"\nopenai_base_url = "{url}/v1"\n')
            del env["MOCK_API_KEY"]
            env["OPENAI_API_KEY"] = "sk-mock-only"
            async with running_server() as server, running_harness(
                server, tmp_path / "home", exec_command=exec_command, env=env, timeout_s=120,
            ):
                first = await server.submit_run("first turn", conversation_id="C1")
                await server.wait_until(finished(first))
                second = await server.submit_run("second turn", conversation_id="C1")
                await server.wait_until(finished(second))
                one, two = (server.run(r).completion or {} for r in (first, second))
                assert one.get("ok") and two.get("ok"), (one, two)
                assert one["reply"] == two["reply"] == REPLY
                assert two["session_id"] == one["session_id"]
