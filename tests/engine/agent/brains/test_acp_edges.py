"""The ACP brain at the protocol's edges, against the fake agent
(tests/agents/fake_acp.py imitating each real agent where it says so): a refused
load or resume, logging in with a key, --safe-tools' choice among the offered
options, the agent's own notices, a permission after the cancel, usage on cancel
and running totals, a cancel answered with an error, a request over the line bound,
closing the session, a late replay, the model and mode, and the setup bound
(issue 38; issue 37 point 11)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import trio

from prohost.engine.agent.brains import acp
from prohost.engine.agent.brains.acp_brain import AcpBrain
from prohost.engine.agent.brains.acp_choices import ChoiceError, choices
from prohost.engine.agent.brains.acp_usage import session_model
from prohost.engine.agent.launch import LINGER_S, Launch, ProcessLimits
from prohost.engine.agent.process import ProcessGroups
from prohost.wire.outcomes import (
    acp_no_reply,
    acp_refusal_ended,
    acp_signed_out,
)
from prohost.wire.usage import Usage
from tests.agents.fake_acp import UNKNOWN_WARNING
from tests.kits.acp import (
    FAKE_ACP,
    PROMPT,
    Talk,
    acp_env,
    cancel_when_working,
    poller,
    read,
    record_of,
    talk,
)
from tests.kits.output import Heard, run_agent

__all__ = ["poller"]  # the autouse fixture, both ways of waiting


def notices(done: Talk) -> list[str]:
    return [e.summary for e in done.events if e.name == "Notice"]


@pytest.mark.protocol("§5")
async def test_a_refused_load_starts_a_new_session_and_says_so(tmp_path: Path) -> None:
    """Gemini CLI with only GEMINI_API_KEY opens new sessions and refuses every
    session/load with -32000: turn 2 must not end the conversation."""
    first = await talk(tmp_path, FAKE_ACP_AUTH="load")
    assert first.outcome is not None and first.outcome.ok
    old = first.outcome.session_id
    second = await talk(tmp_path, session=old, before=first.turn.session_totals(),
                        FAKE_ACP_AUTH="load")
    assert second.outcome is not None and second.outcome.ok, second.outcome
    assert second.outcome.reply == "Hello from the fake ACP agent."
    assert second.outcome.session_id not in (None, old)
    assert second.methods() == ["initialize", "session/load", "session/new",
                                "session/prompt", "eof"]
    said = notices(second)
    assert len(said) == 1 and f"session {old}" in said[0] and "new session" in said[0]
    assert second.turn.renewed is not None and "Authentication required" in second.turn.renewed
    # The new session's cost counts from 0.
    assert second.outcome.usage is not None and second.outcome.usage.cost_usd == 0.25


@pytest.mark.protocol("§5")
async def test_an_agent_is_logged_in_with_the_key_its_environment_holds(
    tmp_path: Path,
) -> None:
    """codex-acp with only OPENAI_API_KEY: -32000 until told to use the key."""
    done = await talk(tmp_path, FAKE_ACP_AUTH="1", FAKE_ACP_KEY_METHOD="1",
                      FAKE_ACP_KEY="k-123")
    assert done.outcome is not None and done.outcome.ok, done.outcome
    assert done.methods() == ["initialize", "session/new", "authenticate", "session/new",
                              "session/prompt", "eof"]
    asked = next(m for m in done.record() if m.get("method") == "authenticate")
    assert asked["params"] == {"methodId": "fake-key"}
    # Resumed the next turn: the load is logged in the same way, then taken back.
    again = await talk(tmp_path, session=done.outcome.session_id, FAKE_ACP_AUTH="1",
                       FAKE_ACP_KEY_METHOD="1", FAKE_ACP_KEY="k-123")
    assert again.outcome is not None and again.outcome.ok
    assert again.outcome.session_id == done.outcome.session_id
    assert again.methods()[:4] == ["initialize", "session/load", "authenticate",
                                   "session/load"]


async def test_an_agent_whose_key_is_missing_names_the_variable(tmp_path: Path) -> None:
    done = await talk(tmp_path, FAKE_ACP_AUTH="1", FAKE_ACP_KEY_METHOD="1", FAKE_ACP_KEY="")
    assert done.outcome is not None and not done.outcome.ok
    assert done.outcome.error == acp_signed_out("Authentication required", ["FAKE_ACP_KEY"])
    assert "set FAKE_ACP_KEY" in done.outcome.error
    assert "authenticate" not in done.methods()


async def test_safe_tools_refuse_with_the_option_that_lets_the_turn_go_on(
    tmp_path: Path,
) -> None:
    done = await talk(tmp_path, "tools", safe_tools=True, FAKE_ACP_OPTIONS="codex_exec")
    answer = next(m for m in done.record() if m.get("id") == 900)
    assert answer["result"] == {"outcome": {"outcome": "selected", "optionId": "denied"}}
    assert done.outcome is not None and done.outcome.ok
    assert done.outcome.reply is not None and done.outcome.reply.endswith("rejected (denied).")


async def test_safe_tools_with_only_a_refusal_that_ends_the_turn_report_it_truly(
    tmp_path: Path,
) -> None:
    done = await talk(tmp_path, "tools", safe_tools=True, FAKE_ACP_OPTIONS="codex_patch")
    answer = next(m for m in done.record() if m.get("id") == 900)
    assert answer["result"] == {"outcome": {"outcome": "selected", "optionId": "abort"}}
    assert done.outcome is not None and not done.outcome.ok
    assert done.outcome.error == acp_refusal_ended("Running pytest -q")


async def test_an_empty_reply_after_a_refused_tool_is_not_a_success(tmp_path: Path) -> None:
    done = await talk(tmp_path, "tools", safe_tools=True, FAKE_ACP_SILENT_REJECT="1")
    assert done.outcome is not None and not done.outcome.ok
    assert done.outcome.error == acp_no_reply("Running pytest -q")
    empty = await talk(tmp_path, FAKE_ACP_REPLY="")
    assert empty.outcome is not None and empty.outcome.error == acp_no_reply(None)


@pytest.mark.parametrize("warning", ["codex", "loose"])
async def test_an_agents_own_notices_are_not_its_reply(tmp_path: Path, warning: str) -> None:
    done = await talk(tmp_path, FAKE_ACP_WARNING=warning)
    assert done.outcome is not None and done.outcome.ok
    assert done.outcome.reply == "Hello from the fake ACP agent."
    said = notices(done)
    assert len(said) == 1
    assert ("Model metadata for `fake-model-1` not found" if warning == "codex"
            else "cache was cold") in said[0]


async def test_an_unknown_warning_before_the_answer_is_a_paragraph_of_its_own(
    tmp_path: Path,
) -> None:
    """codex-acp's warnings look like its answer on the wire (no messageId, nothing
    between them): one that no list knows stays in the reply, whole, but is not
    glued to the answer's first word."""
    done = await talk(tmp_path, FAKE_ACP_WARNING="unknown")
    assert done.outcome is not None and done.outcome.ok
    assert done.outcome.reply == UNKNOWN_WARNING + "\n\nHello from the fake ACP agent."


@pytest.mark.protocol("§6")
async def test_a_permission_asked_after_the_cancel_is_answered_cancelled(
    tmp_path: Path,
) -> None:
    """ACP: once the client sent session/cancel it answers every pending and later
    permission request ``cancelled`` (issue 37 point 11)."""
    groups = ProcessGroups()
    groups.grace_s = 30.0
    done = await cancel_when_working(tmp_path, "hang_asks", groups)
    answer = next(m for m in done.record() if m.get("id") == 902)
    assert answer["result"] == {"outcome": {"outcome": "cancelled"}}
    assert done.turn.stop_reason == "cancelled"


@pytest.mark.protocol("§6", "§7")
async def test_a_cancelled_turn_carries_what_it_spent_before_the_cancel(
    tmp_path: Path,
) -> None:
    groups = ProcessGroups()
    groups.grace_s = 30.0
    done = await cancel_when_working(tmp_path, "hang", groups)
    usage = done.turn.usage()
    # +$0.10 streamed before the cancel, +$0.25 in all by the cancelled answer;
    # Qwen-style call tokens: 30 in (20 of them cached), 7 out + 3 thinking.
    assert usage.cost_usd == 0.25 and usage.turns == 1
    assert (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens) == (10, 10, 20)


@pytest.mark.protocol("§7")
async def test_a_killed_turn_carries_what_it_streamed(tmp_path: Path) -> None:
    groups = ProcessGroups()
    groups.grace_s = 1.0
    with trio.fail_after(10):
        done = await cancel_when_working(tmp_path, "hang_deaf", groups)
    usage = done.turn.usage()
    assert usage.cost_usd == 0.1 and usage.turns is None
    assert (usage.input_tokens, usage.output_tokens) == (10, 10)


@pytest.mark.protocol("§7")
@pytest.mark.parametrize(("before", "flagged"), [
    (Usage(cost_usd=0.25), None),
    (Usage(cost_usd=0.25, includes_earlier_turns=True), True),
    (Usage(), True),  # resumed, and what it had reached is not known
])
async def test_a_running_total_says_when_it_holds_an_earlier_turns_spend(
    tmp_path: Path, before: Usage, flagged: bool | None,
) -> None:
    first = await talk(tmp_path)
    assert first.outcome is not None
    second = await talk(tmp_path, session=first.outcome.session_id, before=before)
    assert second.outcome is not None and second.outcome.usage is not None
    assert second.outcome.usage.includes_earlier_turns is flagged
    assert second.outcome.usage.cost_usd == (0.25 if before.cost_usd else 0.5)
    # A new session's total is all its own.
    assert first.outcome.usage is not None
    assert first.outcome.usage.includes_earlier_turns is None


@pytest.mark.protocol("§6", "§8")
async def test_a_cancel_answered_with_an_error_is_a_cancel_and_closes_its_tools(
    tmp_path: Path,
) -> None:
    groups = ProcessGroups()
    groups.grace_s = 30.0
    done = Talk(AcpBrain(FAKE_ACP).new_turn())
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: talk(tmp_path, "hang", groups=groups, talk_to=done,
                                            FAKE_ACP_CANCEL_ERROR="1"))
            await done.working.wait()
            scope.cancel()
    assert done.turn.stop_reason == "cancelled" and done.turn.error is None
    # The call the agent left open is not left "calling" on the timeline.
    assert [(e.id, e.state) for e in done.events] == [("call_9", "calling"),
                                                      ("call_9", "error")]


@pytest.mark.protocol("§5")
@pytest.mark.parametrize("safe_tools", [False, True])
async def test_a_permission_request_over_the_line_bound_is_still_answered(
    tmp_path: Path, safe_tools: bool,
) -> None:
    with trio.fail_after(60):
        done = await talk(tmp_path, "tools", safe_tools=safe_tools, FAKE_ACP_HUGE_ASK="1")
    answer = next(m for m in done.record() if m.get("id") == 900)
    chosen = "no" if safe_tools else "once"
    assert answer["result"] == {"outcome": {"outcome": "selected", "optionId": chosen}}
    assert done.result is not None and done.result.overlong_lines == 1
    assert done.outcome is not None and done.outcome.ok
    assert done.outcome.reply is not None and done.outcome.reply.endswith(f"({chosen}).")


@pytest.mark.protocol("§5")
async def test_an_agent_that_stays_is_ended_at_once_once_its_session_is_closed(
    tmp_path: Path,
) -> None:
    """codex-acp does not exit at end-of-file: closing its session, then stopping
    it as soon as it answered, spares every run the whole linger."""
    started = trio.current_time()
    done = await talk(tmp_path, FAKE_ACP_LINGER="1", FAKE_ACP_CLOSE="1")
    assert trio.current_time() - started < LINGER_S - 1
    assert done.outcome is not None and done.outcome.ok
    session = done.outcome.session_id
    assert done.methods()[-3:] == ["session/prompt", "session/close", "eof"]
    close = next(m for m in done.record() if m.get("method") == "session/close")
    assert close["params"] == {"sessionId": session}
    # The closed session is the next turn's, taken back as ever.
    again = await talk(tmp_path, session=session, FAKE_ACP_CLOSE="1")
    assert again.outcome is not None and again.outcome.session_id == session


@pytest.mark.protocol("§5")
async def test_a_replay_that_comes_after_the_load_is_drained_before_the_prompt(
    tmp_path: Path,
) -> None:
    first = await talk(tmp_path, FAKE_ACP_REPLY="The first answer.")
    assert first.outcome is not None
    second = await talk(tmp_path, session=first.outcome.session_id,
                        before=first.turn.session_totals(), FAKE_ACP_LATE_REPLAY="1")
    assert second.outcome is not None and second.outcome.ok
    # None of the first turn's words, though they came after the load's answer.
    assert second.outcome.reply == "Hello from the fake ACP agent."
    assert second.methods()[1:4] == ["session/load", "_prohost/sync", "session/prompt"]
    assert second.outcome.usage is not None and second.outcome.usage.cost_usd == 0.25


async def chose(tmp_path: Path, brain: AcpBrain, *, safe_tools: bool = False,
                **env: str) -> Talk:
    """One turn of ``brain`` (its choices made) against the fake agent."""
    brain.safe_tools = safe_tools
    record_of(tmp_path).unlink(missing_ok=True)
    turn = brain.new_turn()
    done = Talk(turn, record_path=record_of(tmp_path))
    agent_env = acp_env(tmp_path, **env)
    result = await run_agent(
        Launch(command=FAKE_ACP, stdin_text="", cwd=tmp_path, env=agent_env,
               conversation=turn.conversation(PROMPT, None, tmp_path, None, agent_env)),
        ProcessGroups(), ProcessLimits(deadline=math.inf, max_stdout_bytes=0),
        Heard(on_line=lambda line: read(done, turn, line)))
    done.result, done.outcome = result, turn.finish(result)
    return done


async def test_a_session_is_given_the_model_and_mode_asked_for(tmp_path: Path) -> None:
    brain = AcpBrain(FAKE_ACP)
    brain.choose({"": "fake-model-2"}, {"": "plan"})
    done = await chose(tmp_path, brain)
    assert done.outcome is not None and done.outcome.ok, done.outcome
    assert done.methods() == ["initialize", "session/new", "session/set_model",
                              "session/set_mode", "session/prompt", "eof"]
    sets = [m["params"] for m in done.record() if m.get("method", "").startswith("session/set")]
    session = done.outcome.session_id
    assert sets == [{"sessionId": session, "modelId": "fake-model-2"},
                    {"sessionId": session, "modeId": "plan"}]
    assert done.turn.model == "fake-model-2" and done.turn.mode == "plan"
    assert done.outcome.usage is not None and done.outcome.usage.model == "fake-model-2"


async def test_each_account_gets_its_own_model(tmp_path: Path) -> None:
    brain = AcpBrain(FAKE_ACP)
    brain.choose({"work": "fake-model-2"}, {}, [("work", Path("/accounts/work")),
                                                 ("home", Path("/accounts/home"))])
    work = await chose(tmp_path, brain, PROHOST_ACCOUNT_DIR="/accounts/work")
    assert "session/set_model" in work.methods() and work.turn.model == "fake-model-2"
    home = await chose(tmp_path, brain, PROHOST_ACCOUNT_DIR="/accounts/home")
    assert "session/set_model" not in home.methods() and home.turn.model == "fake-model-1"


async def test_safe_tools_put_the_session_in_the_agents_asking_mode(tmp_path: Path) -> None:
    done = await chose(tmp_path, AcpBrain(FAKE_ACP), safe_tools=True, FAKE_ACP_MODE_START="yolo")
    assert done.outcome is not None and done.outcome.ok
    asked = next(m for m in done.record() if m.get("method") == "session/set_mode")
    assert asked["params"]["modeId"] == "default" and done.turn.mode == "default"
    # Already asking: nothing to set.
    again = await chose(tmp_path, AcpBrain(FAKE_ACP), safe_tools=True)
    assert "session/set_mode" not in again.methods()


async def test_a_model_the_agent_does_not_offer_is_refused_naming_what_it_offers(
    tmp_path: Path,
) -> None:
    brain = AcpBrain(FAKE_ACP)
    brain.choose({"": "gpt-99"}, {})
    done = await chose(tmp_path, brain)
    assert done.outcome is not None and not done.outcome.ok
    assert done.outcome.error is not None
    assert "gpt-99" in done.outcome.error and "fake-model-1, fake-model-2" in done.outcome.error
    assert "session/prompt" not in done.methods()


def test_config_options_are_set_as_config_options() -> None:
    """OpenCode's model (and the Claude Code adapter's) is a ``configOptions`` entry;
    Qwen Code's model ids carry its auth type."""
    answer = {"configOptions": [{"id": "model", "category": "model", "type": "select",
                                 "currentValue": "mock/mock-model",
                                 "options": [{"value": "mock/mock-model", "name": "Mock"},
                                             {"group": "zen", "options": [
                                                 {"value": "opencode/big", "name": "Big"}]}]}]}
    assert choices(answer, "s1", model="opencode/big", mode=None, safe_tools=False) == [
        ("session/set_config_option", {"sessionId": "s1", "configId": "model",
                                       "value": "opencode/big"})]
    assert choices(answer, "s1", model="mock/mock-model", mode=None, safe_tools=False) == []
    qwen = {"models": {"currentModelId": "coder-model(qwen-oauth)", "availableModels": [
        {"modelId": "coder-model(qwen-oauth)"}, {"modelId": "$runtime|openai|mock-model(openai)"}]}}
    assert choices(qwen, "s1", model="mock-model", mode=None, safe_tools=False) == [
        ("session/set_model", {"sessionId": "s1",
                               "modelId": "$runtime|openai|mock-model(openai)"})]
    with pytest.raises(ChoiceError, match="offers no way to choose its mode"):
        choices(answer, "s1", model=None, mode="plan", safe_tools=False)


@pytest.mark.protocol("§5")
@pytest.mark.parametrize("scenario", ["hang_init", "hang_setup"])
async def test_an_agent_that_hangs_before_the_prompt_is_stopped_at_the_setup_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scenario: str,
) -> None:
    monkeypatch.setattr(acp, "SETUP_S", 1.0)
    groups = ProcessGroups()
    groups.grace_s = 1.0
    with trio.fail_after(20):  # --idle-timeout and --timeout are both far away
        done = await talk(tmp_path, groups=groups, FAKE_ACP_HANG=scenario)
    step = "initialize" if scenario == "hang_init" else "session/new"
    assert done.outcome is not None and not done.outcome.ok
    assert done.outcome.error is not None
    assert done.outcome.error.startswith(f"the agent did not answer {step} ")
    assert len(groups) == 0


def test_the_claude_adapters_default_model_is_named_by_its_description() -> None:
    answer = {"configOptions": [{"id": "model", "category": "model", "type": "select",
                                 "currentValue": "default", "options": [
        {"value": "default", "name": "Default (recommended)",
         "description": "Use the default model (currently Opus 4.8 (1M context)) · $5/$25"},
        {"value": "sonnet", "name": "Sonnet", "description": "Sonnet 4.6"}]}]}
    assert session_model(answer) == "Opus 4.8 (1M context)"
    assert session_model({"models": {"currentModelId": "$runtime|openai|mock-model(openai)"}}) \
        == "mock-model"
