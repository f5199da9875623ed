"""A run's usage as a completion says it (docs/protocol.md §7 ``usage``): the shape.

What each agent CLI calls these figures, and how its output becomes a
:class:`Usage`, is the agent's knowledge (:mod:`prohost.engine.agent.usage`); this
module holds only the protocol's keys, what a valid value of each is, and the
sum of a run's attempts. The converter (:mod:`prohost.wire.protocol`) writes a
:class:`Usage` with only the keys known, in the order below, and reads one
leniently: a figure that is not valid (from an older ledger row, or from a
server's JSON) is left out, never raised.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs
from cattrs.gen import make_dict_unstructure_fn

from prohost.wire.protocol import converter

#: The protocol's figures, in the order they are sent (then the flag
#: ``includes_earlier_turns``, only when true).
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
    #: ``True``: the figures also hold an earlier turn's, which its CLI reported
    #: nothing for (a failed Codex turn); ``None`` otherwise (the key is then absent).
    includes_earlier_turns: bool | None = None

    def __add__(self, other: Usage) -> Usage:
        """Two attempts of one run, summed; the later attempt's model wins."""
        return Usage(
            **{key: _sum(getattr(self, key), getattr(other, key)) for key in _COUNTS},
            cost_usd=_sum(self.cost_usd, other.cost_usd),
            model=other.model or self.model,
            includes_earlier_turns=self.includes_earlier_turns or other.includes_earlier_turns,
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

    def known(self) -> Usage | None:
        """This usage, or ``None`` when no figure is known (§7: ``usage`` is then
        absent from the completion)."""
        return None if self == _NOTHING else self

    def to_json(self) -> dict[str, Any] | None:
        """The §7 ``usage`` object: only the keys known; ``None`` when none is."""
        found: dict[str, Any] = converter.unstructure(self)
        return found or None

    @classmethod
    def from_json(cls, data: object) -> Usage:
        """A ``usage`` object as :meth:`to_json` wrote it (or anything else: what is
        not valid is left out)."""
        if not isinstance(data, Mapping):
            return cls()
        return cls(**{key: valid_count(data.get(key)) for key in _COUNTS},
                   cost_usd=valid_cost(data.get("cost_usd")),
                   model=valid_model(data.get("model")),
                   includes_earlier_turns=True if data.get("includes_earlier_turns") is True
                   else None)


_NOTHING = Usage()

converter.register_unstructure_hook(
    Usage, make_dict_unstructure_fn(Usage, converter, _cattrs_omit_if_default=True))
converter.register_structure_hook(Usage, lambda data, _: Usage.from_json(data))


def valid_count(value: object) -> int | None:
    """``value`` as a token or turn count: a non-negative integer, else ``None``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def valid_cost(value: object) -> float | None:
    """``value`` as a cost in US dollars: a non-negative finite number, else ``None``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    cost = float(value)
    return cost if math.isfinite(cost) and cost >= 0 else None


def valid_model(value: object) -> str | None:
    """``value`` as a model name: trimmed, printable, at most :data:`MAX_MODEL_CHARS`;
    ``None`` for anything else."""
    if not isinstance(value, str) or not value.strip():
        return None
    return "".join(ch for ch in value.strip() if ch.isprintable())[:MAX_MODEL_CHARS] or None


def _sum(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    return a + b
