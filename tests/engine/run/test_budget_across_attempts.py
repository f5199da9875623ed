"""A run's budget covers all its attempts (docs/protocol.md §12), the user's own
``--max-budget-usd`` in ``--exec`` included: the next attempt is given what is left
of it, none is started when nothing is, and the error quotes that amount with the
figure ``usage.cost_usd`` says. Through the whole harness, the reference server and
the fake Claude CLI (tests/agents/fake_claude.py), whose accounts spend $0.0342
before their usage limit."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import trio

from prohost.engine.agent.brains.claude import ClaudeBrain
from prohost.engine.agent.process import AgentWatch, ProcessGroups
from prohost.engine.run.execute import AgentSetup, Attempt, ExecSpec, execute
from prohost.engine.run.progress import Progress
from prohost.wire.runs import AgentRun
from tests.kits.accounts import accounts_used, fail_over_once
from tests.kits.fake_clis import FAKE_CLAUDE, claude_env, invocations, resumed

pytestmark = pytest.mark.protocol("§12")


def budget_words(call: dict[str, Any]) -> list[str]:
    """The budget flags of one invocation, in order (the CLI obeys the last)."""
    argv: list[str] = call["argv"]
    return [word if word.startswith("--") and "=" in word else f"{word} {argv[i + 1]}"
            for i, word in enumerate(argv) if word.startswith("--max-budget-usd")]


async def test_the_users_own_budget_covers_a_fail_over(tmp_path: Path) -> None:
    """--exec says --max-budget-usd 0.05 (and --max-cost a larger $0.5): a spends
    $0.0342 before its limit, so b is given the $0.0158 left of the user's $0.05,
    after their flag (which it overrides), and stops there; the error quotes $0.05
    and the whole run's spend, usage.cost_usd's figure."""
    completion = await fail_over_once(tmp_path, f"{FAKE_CLAUDE} --max-budget-usd 0.05",
                                      max_cost_usd=0.5)
    calls = invocations(tmp_path)
    assert accounts_used(tmp_path) == ["a", "b"]
    assert budget_words(calls[0]) == ["--max-budget-usd 0.05"]
    assert budget_words(calls[1]) == ["--max-budget-usd 0.05", "--max-budget-usd=0.0158"]
    assert completion["ok"] is False and completion["retryable"] is False
    assert completion["account"] == "b"
    assert completion["usage"]["cost_usd"] == pytest.approx(0.0684)
    assert completion["error"] == "the run reached its budget of $0.05 (it spent $0.0684)"


async def test_nothing_left_of_the_users_budget_starts_no_other_attempt(
    tmp_path: Path,
) -> None:
    """--exec says --max-budget-usd 0.03 and a spent $0.0342: nothing is left, so b
    is never started (not with a budget of 0, nor with the user's whole amount) and
    the run ends at its budget, not retryable."""
    completion = await fail_over_once(tmp_path, f"{FAKE_CLAUDE} --max-budget-usd 0.03")
    assert accounts_used(tmp_path) == ["a"]
    assert completion["ok"] is False and completion["retryable"] is False
    assert completion["account"] == "a"
    assert completion["usage"]["cost_usd"] == 0.0342
    assert completion["error"] == "the run reached its budget of $0.03 (it spent $0.0342)"


async def test_an_attempt_with_nothing_left_is_not_started(
    tmp_path: Path, groups: ProcessGroups,
) -> None:
    """An attempt handed a budget of 0 (all of the run's spent by earlier ones) ends
    at the budget without spawning: a CLI given 0 would still start and spend."""
    spawned: list[int] = []

    async def on_spawn(agent: AgentWatch) -> None:
        spawned.append(agent.pgid)

    brain = ClaudeBrain(FAKE_CLAUDE, max_cost_usd=0.05)
    spec = ExecSpec(command=FAKE_CLAUDE, workdir=tmp_path, timeout_s=0.0, idle_timeout_s=0.0,
                    parallel=False, secrets=())
    run = AgentRun(run_id="run_budget_1", completion_path="/c", text="hello", author="dana")
    attempt = Attempt(run, "hello", claude_env(tmp_path), "a-session", math.inf,
                      max_cost_usd=0.0)
    with trio.fail_after(30):
        result = await execute(attempt, AgentSetup(brain, spec, groups), Progress(), on_spawn)
    assert spawned == [] and not (tmp_path / "record.json").exists()
    assert result.reached_budget and not result.started
    assert result.session_id == "a-session"  # the lane keeps its session


async def test_a_refused_resume_that_spent_what_was_left_starts_no_fresh_session(
    tmp_path: Path, groups: ProcessGroups,
) -> None:
    """The CLI refuses the session to resume, and says that cost all the attempt had
    ($0.0342 of $0.0342): the run ends at its budget there, not with a fresh session
    started on $0 (which a CLI would still start and spend on). The lane keeps its
    session: it was the budget that ended the run, not a fresh one."""
    env = claude_env(tmp_path, "no_session", FAKE_CLAUDE_REFUSED_COST="0.0342")
    brain = ClaudeBrain(FAKE_CLAUDE, max_cost_usd=0.05)
    spec = ExecSpec(command=FAKE_CLAUDE, workdir=tmp_path, timeout_s=0.0, idle_timeout_s=0.0,
                    parallel=False, secrets=())
    run = AgentRun(run_id="run_budget_2", completion_path="/c", text="hello", author="dana")
    attempt = Attempt(run, "hello", env, "a-session", math.inf, max_cost_usd=0.0342)
    with trio.fail_after(30):
        result = await execute(attempt, AgentSetup(brain, spec, groups), Progress(),
                               noop_spawn)
    assert [resumed(call) for call in invocations(tmp_path)] == ["a-session"]
    assert result.reached_budget and result.started
    assert result.spent.cost_usd == 0.0342
    assert result.outcome.ok is False
    assert result.session_id == "a-session"


async def noop_spawn(agent: AgentWatch) -> None:
    pass
