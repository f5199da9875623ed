"""A run's usage in the protocol's keys (PROTOCOL.md §7 ``usage``), whatever the CLI
calls them.

- Claude Code's ``result`` event (stream-json; the shape of ``ResultMessage`` in
  anthropics/claude-agent-sdk-python ``types.py``) carries this invocation's own
  figures: ``usage.input_tokens``, ``usage.output_tokens``,
  ``usage.cache_read_input_tokens``, ``usage.cache_creation_input_tokens``,
  ``total_cost_usd`` and ``num_turns``; the model is named by the ``system``/``init``
  event. Its ``input_tokens`` counts only what was not read from the cache.
- Codex's ``turn.completed`` (``codex exec --json``; ``Usage`` in openai/codex
  ``codex-rs/exec/src/exec_events.rs``) carries ``input_tokens``,
  ``cached_input_tokens`` and ``output_tokens`` as the *thread's running totals*
  (openai/codex issue #17539, ``usage_from_last_total``), so a resumed session's run
  is the difference from what the session had reached before it. Its
  ``input_tokens`` includes the cached ones, which are taken out here so that
  ``input_tokens`` means the same for both CLIs. Codex prints no cost.

Everything read from a CLI is checked: a count that is not a non-negative integer,
or a cost that is not a non-negative finite number, is left out, never raised.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

#: The protocol's keys, in the order they are sent.
KEYS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
        "cost_usd", "turns", "model")
_COUNTS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
           "turns")
#: A model name longer than this is cut (it is shown in panels and reports).
MAX_MODEL_CHARS = 120


@attrs.frozen
class Usage:
    """One run's (or one attempt's) figures; ``None`` where the CLI did not say."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    cost_usd: float | None = None
    turns: int | None = None
    model: str | None = None

    def __add__(self, other: Usage) -> Usage:
        """Two attempts of one run, summed; the later attempt's model wins."""
        return Usage(
            **{key: _sum(getattr(self, key), getattr(other, key)) for key in _COUNTS},
            cost_usd=_sum(self.cost_usd, other.cost_usd),
            model=other.model or self.model,
        )

    def since(self, earlier: Usage) -> Usage:
        """Running totals (``self``) less what they were at ``earlier``: this run's
        share. Totals that went down (a new session behind the same id) count from 0."""
        def less(now: int | None, then: int | None) -> int | None:
            if now is None:
                return None
            return now - then if then is not None and then <= now else now

        counts: dict[str, Any] = {key: less(getattr(self, key), getattr(earlier, key))
                                  for key in _COUNTS}
        return attrs.evolve(self, **counts)

    def to_json(self) -> dict[str, Any] | None:
        """The §7 ``usage`` object: only the keys known; ``None`` when none is."""
        found = {key: getattr(self, key) for key in KEYS if getattr(self, key) is not None}
        return found or None

    @classmethod
    def from_json(cls, data: object) -> Usage:
        """A ``usage`` object as :meth:`to_json` wrote it (or anything else: what is
        not valid is left out)."""
        if not isinstance(data, Mapping):
            return cls()
        return cls(**{key: _count(data.get(key)) for key in _COUNTS},
                   cost_usd=_cost(data.get("cost_usd")), model=_model(data.get("model")))


def from_claude_result(event: Mapping[str, Any], model: str | None = None) -> Usage:
    """This invocation's usage from Claude Code's ``result`` event; ``model`` is the
    one its ``init`` event named."""
    raw = event.get("usage")
    usage: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    return Usage(
        input_tokens=_count(usage.get("input_tokens")),
        output_tokens=_count(usage.get("output_tokens")),
        cache_read_tokens=_count(usage.get("cache_read_input_tokens")),
        cache_write_tokens=_count(usage.get("cache_creation_input_tokens")),
        cost_usd=_cost(event.get("total_cost_usd")),
        turns=_count(event.get("num_turns")),
        model=_model(model),
    )


def from_codex_totals(usage: object, model: str | None = None) -> Usage:
    """The thread's running totals from a Codex ``turn.completed`` event's
    ``usage`` (subtract the totals before the run with :meth:`Usage.since`)."""
    raw: Mapping[str, Any] = usage if isinstance(usage, Mapping) else {}
    given = _count(raw.get("input_tokens"))
    cached = _count(raw.get("cached_input_tokens"))
    fresh = None if given is None else given - min(given, cached or 0)
    return Usage(input_tokens=fresh, output_tokens=_count(raw.get("output_tokens")),
                 cache_read_tokens=cached, model=_model(model))


def _sum(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _cost(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    cost = float(value)
    return cost if math.isfinite(cost) and cost >= 0 else None


def _model(value: object) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return None
    return "".join(ch for ch in value.strip() if ch.isprintable())[:MAX_MODEL_CHARS] or None
