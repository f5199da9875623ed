"""What an agent's output says while it runs, kept as plain state for the run.

The watch (:mod:`prohost.engine.agent.process`) hands each stdout line and the
time of every read to an :class:`OutputReader`. The reader feeds the lines to the
brain's :class:`~prohost.engine.agent.brains.base.Turn`, keeps what the turn has
learnt in a :class:`Seen` (the session, what the agent is doing, its model and
mode, when it last printed), and hands the tool calls it read to the run's
timeline (§8). Nothing here calls back into the run: the run's
:class:`~prohost.engine.run.progress.Progress` *is* a :class:`Seen`, read by
heartbeats, the panel and the report whenever they look.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import attrs

from prohost.wire.timeline import ToolEvent

if TYPE_CHECKING:
    from prohost.engine.agent.brains.base import Turn

__all__ = ["OutputReader", "Seen", "ToolEventSink"]


class ToolEventSink(Protocol):
    """Where an attempt's tool calls go (the run's timeline, §8): it must take them
    at once, never block and never raise."""

    def add(self, events: list[ToolEvent]) -> None: ...


@attrs.define
class Seen:
    """What a run's agents have shown of themselves so far, readable at any moment
    (also after a cancel: a cancelled run is reported with the session it had)."""

    session_id: str | None = None
    #: What the agent is doing now, for heartbeats: "Bash: pytest -q".
    activity: str | None = None
    model: str | None = None
    mode: str | None = None
    #: trio time of the agent's latest output (the idle timer counts from it).
    last_output: float | None = None


class OutputReader:
    """One spawn's :class:`~prohost.engine.agent.launch.Output`: a streaming brain's
    lines go to ``turn`` (``None``: the brain reads the whole stdout at the end), what
    it learnt into ``seen``, its tool calls to ``timeline``."""

    def __init__(self, seen: Seen, turn: Turn | None = None,
                 timeline: ToolEventSink | None = None) -> None:
        self.seen = seen
        self.turn = turn
        self.timeline = timeline
        self.reads_lines = turn is not None

    def line(self, raw: bytes) -> None:
        turn, seen = self.turn, self.seen
        if turn is None:
            return
        events = turn.feed(raw)
        if turn.session_id is not None:
            seen.session_id = turn.session_id
        seen.activity = turn.activity
        seen.model = turn.model or seen.model
        seen.mode = turn.mode or seen.mode
        if events and self.timeline is not None:
            self.timeline.add(events)

    def heard(self, at: float) -> None:
        self.seen.last_output = at
