"""A run's usage read from what each agent CLI prints, into the protocol's keys
(docs/protocol.md §7 ``usage``; the shape is :class:`prohost.wire.usage.Usage`).

- Claude Code's ``result`` event (stream-json; the shape of ``ResultMessage`` in
  anthropics/claude-agent-sdk-python ``types.py``) carries this invocation's own
  figures: ``usage.input_tokens``, ``usage.output_tokens``,
  ``usage.cache_read_input_tokens``, ``usage.cache_creation_input_tokens``,
  ``total_cost_usd`` and ``num_turns``; the model is named by the ``system``/``init``
  event. Its ``input_tokens`` counts only what was not read from the cache.
  ``usage`` is the main loop's alone: a subagent's tokens (the Task tool) are not
  in it, while ``total_cost_usd`` and ``modelUsage`` are the whole process's. So the
  token counts come from ``modelUsage`` (model name → ``inputTokens``,
  ``outputTokens``, ``cacheReadInputTokens``, ``cacheCreationInputTokens``,
  ``costUSD``: checked in the real Claude Code 2.1.197 binary, which keeps one such
  record per model and adds each API response's ``input_tokens``, ``output_tokens``,
  ``cache_read_input_tokens`` and ``cache_creation_input_tokens`` to it, and in the
  ``ModelUsage`` type of ``@anthropic-ai/claude-agent-sdk``'s ``sdk.d.ts``; the
  recorded real output in tests/agents/recorded/ has only an empty ``modelUsage``),
  summed over every model (a count no model gives: ``usage``'s); ``inputTokens``
  excludes the cache reads and writes as ``usage.input_tokens`` does.
- Codex's ``turn.completed`` (``codex exec --json``; ``Usage`` in openai/codex
  ``codex-rs/exec/src/exec_events.rs``) carries ``input_tokens``,
  ``cached_input_tokens`` and ``output_tokens`` as the *thread's running totals*
  (openai/codex issue #17539, ``usage_from_last_total``), so a resumed session's run
  is the difference from what the session had reached before it. Its
  ``input_tokens`` includes the cached ones, which are taken out here so that
  ``input_tokens`` means the same for both CLIs. Codex prints no cost.
- Codex's session rollout file (``$CODEX_HOME/sessions/YYYY/MM/DD/rollout-<time>-<thread
  id>.jsonl``) holds the same running totals for a turn that never completed: see
  :func:`from_codex_rollout_line`.

Everything read from a CLI is checked: a count that is not a non-negative integer,
or a cost that is not a non-negative finite number, is left out, never raised.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from prohost.wire.usage import Usage, valid_cost, valid_count, valid_model


def from_claude_result(event: Mapping[str, Any], model: str | None = None) -> Usage:
    """This invocation's usage from Claude Code's ``result`` event; ``model`` is the
    one its ``init`` event named."""
    raw = event.get("usage")
    usage: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    models = event.get("modelUsage")
    per_model = [figures for figures in models.values() if isinstance(figures, Mapping)] \
        if isinstance(models, Mapping) else []

    def tokens(total_key: str, main_key: str) -> int | None:
        # Every model the process used, its subagents' included (issue 28 point
        # 7); a count no model gives is the main loop's.
        summed = _summed(per_model, total_key)
        return summed if summed is not None else valid_count(usage.get(main_key))

    return Usage(
        input_tokens=tokens("inputTokens", "input_tokens"),
        output_tokens=tokens("outputTokens", "output_tokens"),
        cache_read_tokens=tokens("cacheReadInputTokens", "cache_read_input_tokens"),
        cache_write_tokens=tokens("cacheCreationInputTokens", "cache_creation_input_tokens"),
        cost_usd=valid_cost(event.get("total_cost_usd")),
        turns=valid_count(event.get("num_turns")),
        model=valid_model(model),
    )


def _summed(per_model: list[Mapping[str, Any]], key: str) -> int | None:
    """``key`` added up over the models that give it as a valid count (``None``:
    none does)."""
    counts = [count for figures in per_model
              if (count := valid_count(figures.get(key))) is not None]
    return sum(counts) if counts else None


def from_codex_totals(usage: object, model: str | None = None) -> Usage:
    """The thread's running totals from a Codex ``turn.completed`` event's
    ``usage`` (subtract the totals before the run with :meth:`Usage.since`)."""
    raw: Mapping[str, Any] = usage if isinstance(usage, Mapping) else {}
    given = valid_count(raw.get("input_tokens"))
    cached = valid_count(raw.get("cached_input_tokens"))
    fresh = None if given is None else given - min(given, cached or 0)
    return Usage(input_tokens=fresh, output_tokens=valid_count(raw.get("output_tokens")),
                 cache_read_tokens=cached, model=valid_model(model))


def from_codex_rollout_line(line: bytes | str) -> Usage | None:
    """The thread's running totals from one line of a Codex session rollout file, or
    ``None`` when the line is not a token count that carries them.

    The shapes, as openai/codex writes them (read at commit 035416b):
    ``codex-rs/core/src/rollout/recorder.rs`` writes each line as ``RolloutLineRef``
    (``{"timestamp": …}`` flattened with a ``RolloutItem``), and
    ``codex-rs/core/src/rollout/policy.rs`` (``should_persist_event_msg``) keeps
    ``EventMsg::TokenCount``; ``codex-rs/protocol/src/protocol.rs`` has ``RolloutItem``
    tagged ``type``/``payload`` (``event_msg``), ``EventMsg`` tagged ``type``
    (``token_count``), ``TokenCountEvent {info: Option<TokenUsageInfo>, rate_limits}``,
    ``TokenUsageInfo {total_token_usage, last_token_usage, model_context_window}`` and
    ``TokenUsage {input_tokens, cached_input_tokens, output_tokens,
    reasoning_output_tokens, total_tokens}``::

        {"timestamp":"2025-10-28T12:00:03.120Z","type":"event_msg","payload":{
         "type":"token_count","info":{"total_token_usage":{"input_tokens":2400,
         "cached_input_tokens":400,"output_tokens":690,"reasoning_output_tokens":0,
         "total_tokens":3090},"last_token_usage":{…},"model_context_window":272000},
         "rate_limits":null}}

    ``total_token_usage`` is the thread's running total (``append_last_usage`` adds
    each model response's ``last_token_usage`` to it), the figure ``turn.completed``
    carries too; ``info`` is ``null`` before the first response."""
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if not isinstance(event, Mapping) or event.get("type") != "event_msg":
        return None
    payload = event.get("payload")
    if not isinstance(payload, Mapping) or payload.get("type") != "token_count":
        return None
    info = payload.get("info")
    total = info.get("total_token_usage") if isinstance(info, Mapping) else None
    if not isinstance(total, Mapping):
        return None
    usage = from_codex_totals(total)
    return None if usage.known() is None else usage
