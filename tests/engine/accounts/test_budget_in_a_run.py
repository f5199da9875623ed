"""A run at its ``--max-cost`` budget (PROTOCOL.md §12), through the whole harness
and the fake Claude CLI: reported failed, not retryable, saying the budget and the
spend, with its session (the next turn resumes it) and its usage."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

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
