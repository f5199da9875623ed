"""A run at its ``--max-cost`` budget (docs/protocol.md §12), through the whole harness
and the fake Claude CLI: reported failed, not retryable, saying the budget and the
spend, with its session (the next turn resumes it) and its usage."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.kits.accounts import accounts_used, fail_over_once
from tests.kits.fake_clis import FAKE_CLAUDE, claude_env, invocations, resumed
from tests.kits.harness import finished, running_harness, running_server

pytestmark = pytest.mark.protocol("§12")


async def test_a_run_at_its_budget_is_reported_with_its_session_and_spend(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=FAKE_CLAUDE, brain="claude",
            env=claude_env(tmp_path), max_cost_usd=0.01,
        ):
            first = await server.submit_run("a costly question", conversation_id="C1")
            await server.wait_until(finished(first))
            second = await server.submit_run("and then?", conversation_id="C1")
            await server.wait_until(finished(second))
    completion = server.run(first).completion or {}
    assert completion["ok"] is False and completion["retryable"] is False
    assert completion["error"] == "the run reached its budget of $0.01 (it spent $0.0342)"
    assert completion["usage"]["cost_usd"] == 0.0342
    assert completion["usage"]["model"] == "claude-sonnet-4-5-20250929"
    session = completion["session_id"]
    calls = invocations(tmp_path)
    assert all("--max-budget-usd=0.01" in call["argv"] for call in calls)
    # The conversation goes on in the same session.
    assert [resumed(call) for call in calls] == [None, session]


async def test_after_a_fail_over_the_next_account_gets_what_is_left_of_the_budget(
    tmp_path: Path,
) -> None:
    """Issue 28 point 9: $0.05 for the run; a spends $0.0342 before its limit, so b
    is given $0.0158, not a fresh $0.05, and stops there. The error says the run's
    budget and the run's spend, the figure its usage.cost_usd says."""
    completion = await fail_over_once(tmp_path, max_cost_usd=0.05)
    calls = invocations(tmp_path)
    assert accounts_used(tmp_path) == ["a", "b"]
    assert "--max-budget-usd=0.05" in calls[0]["argv"]
    assert "--max-budget-usd=0.0158" in calls[1]["argv"]
    assert completion["ok"] is False and completion["retryable"] is False
    assert completion["account"] == "b"
    assert completion["usage"]["cost_usd"] == pytest.approx(0.0684)
    assert completion["error"] == "the run reached its budget of $0.05 (it spent $0.0684)"


async def test_with_nothing_left_of_the_budget_no_other_account_is_tried(
    tmp_path: Path,
) -> None:
    """$0.03 for the run, and a spent $0.0342 before its limit: nothing is left, so
    the run ends at its budget (not retryable) instead of spending b's too."""
    completion = await fail_over_once(tmp_path, max_cost_usd=0.03)
    assert accounts_used(tmp_path) == ["a"]
    assert completion["ok"] is False and completion["retryable"] is False
    assert completion["account"] == "a"
    assert completion["error"] == "the run reached its budget of $0.03 (it spent $0.0342)"
    assert completion["usage"]["cost_usd"] == 0.0342


async def test_the_users_own_max_budget_usd_is_the_budget_the_error_names(
    tmp_path: Path,
) -> None:
    """--exec passes --max-budget-usd 0.02 itself, which the CLI obeys: the error
    quotes that budget, not --max-cost's."""
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=f"{FAKE_CLAUDE} --max-budget-usd 0.02",
            brain="claude", env=claude_env(tmp_path), max_cost_usd=0.5,
        ):
            run_id = await server.submit_run("a costly question", conversation_id="C1")
            await server.wait_until(finished(run_id))
    completion = server.run(run_id).completion or {}
    assert completion["error"] == "the run reached its budget of $0.02 (it spent $0.0342)"
