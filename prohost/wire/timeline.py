"""A run's timeline row (docs/protocol.md §8): one tool call starting, or how it ended.

The brains make them from their CLI's stream (:mod:`prohost.engine.agent.brains`);
the reporter posts them in batches (:mod:`prohost.engine.report.timeline`).
"""

from __future__ import annotations

import time
from typing import Any, Literal

import attrs

from prohost.wire.protocol import converter

ToolState = Literal["calling", "done", "error"]


@attrs.frozen
class ToolEvent:
    """One timeline row (§8): a tool call starting, or how it ended."""

    id: str
    name: str
    state: ToolState
    summary: str
    at: float = attrs.field(factory=time.time)

    def to_json(self) -> dict[str, Any]:
        """The row as §8's ``events`` list carries it."""
        row: dict[str, Any] = converter.unstructure(self)
        return row
