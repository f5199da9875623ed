"""A run's usage in the protocol's keys (§7), from the CLIs' own shapes."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prohost.engine.agent.usage import from_claude_result, from_codex_totals
from prohost.wire.usage import KEYS, Usage

pytestmark = pytest.mark.protocol("§7")

# The shape of Claude Code's stream-json `result` event (ResultMessage in
# anthropics/claude-agent-sdk-python), as tests/agents/fake_claude.py prints it.
CLAUDE_RESULT = {
    "type": "result", "subtype": "success", "is_error": False, "duration_ms": 4211,
    "num_turns": 3, "result": "done", "session_id": "s1", "total_cost_usd": 0.0123,
    "usage": {"input_tokens": 1200, "cache_creation_input_tokens": 50,
              "cache_read_input_tokens": 900, "output_tokens": 380,
              "server_tool_use": {"web_search_requests": 0}, "service_tier": "standard"},
}


def test_claude_result_in_the_protocols_keys() -> None:
    usage = from_claude_result(CLAUDE_RESULT, "claude-sonnet-4-5")
    assert usage.to_json() == {
        "input_tokens": 1200, "output_tokens": 380, "cache_read_tokens": 900,
        "cache_write_tokens": 50, "cost_usd": 0.0123, "turns": 3,
        "model": "claude-sonnet-4-5"}
    assert list(usage.to_json() or {}) == list(KEYS)


def test_attempts_of_one_run_are_summed() -> None:
    first = from_claude_result(CLAUDE_RESULT, "claude-opus-4")
    second = from_claude_result({"num_turns": 1, "total_cost_usd": 0.5,
                                 "usage": {"input_tokens": 10, "output_tokens": 5}},
                                "claude-sonnet-4-5")
    total = (first + second).to_json()
    assert total == {"input_tokens": 1210, "output_tokens": 385, "cache_read_tokens": 900,
                     "cache_write_tokens": 50, "cost_usd": 0.5123, "turns": 4,
                     "model": "claude-sonnet-4-5"}


def test_codex_running_totals_become_this_runs_figures() -> None:
    # `turn.completed` of a resumed thread: the totals since the thread began.
    before = from_codex_totals({"input_tokens": 1000, "cached_input_tokens": 200,
                                "output_tokens": 300})
    now = from_codex_totals({"input_tokens": 1600, "cached_input_tokens": 500,
                             "output_tokens": 420, "reasoning_output_tokens": 7}, "gpt-5")
    run = now.since(before)
    assert run.to_json() == {"input_tokens": 300, "output_tokens": 120,
                             "cache_read_tokens": 300, "model": "gpt-5"}
    # A fresh thread: nothing before, the totals are the run's.
    assert now.since(Usage()) == now
    # A total that went down is a different thread: counted from zero.
    assert before.since(now).input_tokens == 800


def test_nothing_known_is_no_usage_at_all() -> None:
    assert Usage().to_json() is None
    assert from_claude_result({"type": "result"}).to_json() is None
    assert from_codex_totals(None).to_json() is None


@given(st.dictionaries(st.text(max_size=30), st.none() | st.booleans() | st.integers()
                       | st.floats() | st.text(max_size=5), max_size=8),
       st.none() | st.booleans() | st.integers() | st.floats() | st.text())
def test_whatever_a_cli_prints_the_figures_are_valid_or_absent(
    usage: dict[str, Any], cost: Any,
) -> None:
    for found in (from_claude_result({"usage": usage, "total_cost_usd": cost,
                                      "num_turns": cost}),
                  from_codex_totals(usage), Usage.from_json({**usage, "cost_usd": cost})):
        data = found.to_json() or {}
        for key, value in data.items():
            assert key in KEYS
            if key == "model":
                assert isinstance(value, str)
            elif key == "cost_usd":
                assert isinstance(value, float) and math.isfinite(value) and value >= 0
            else:
                assert type(value) is int and value >= 0
        assert Usage.from_json(data) == found


def test_a_usage_survives_its_round_trip() -> None:
    usage = from_claude_result(CLAUDE_RESULT, "m")
    assert Usage.from_json(usage.to_json()) == usage
