"""An ACP turn's tool calls as timeline rows (§8) and as the run's activity.

ACP announces a call with a ``tool_call`` update (``toolCallId``, ``title``,
``kind``, ``status``) and tells how it goes with ``tool_call_update``s until its
``status`` is ``completed`` or ``failed`` (agentclientprotocol/agent-client-protocol
``schema/v1/schema.json``). Gemini CLI 0.61 announces a call that needs a
permission only in the ``session/request_permission``'s ``toolCall``, then ends
it with a ``tool_call_update``: a call first seen in an update with a title is
announced there. A call still open when the turn ends never ends by itself: it is
ended as an error (:meth:`ToolCalls.close_all`), not left "calling".
"""

from __future__ import annotations

from typing import Any

from prohost.engine.agent.brains.base import one_line
from prohost.engine.agent.brains.summaries import activity
from prohost.wire.timeline import ToolEvent, ToolState

#: Tool kinds (ACP ``ToolKind``) as the timeline names them.
KIND_NAMES = {
    "read": "Read", "edit": "Edit", "delete": "Delete", "move": "Move",
    "search": "Search", "execute": "Execute", "think": "Think", "fetch": "Fetch",
    "switch_mode": "Mode",
}


class ToolCalls:
    """The turn's tool calls: which are open, which ended."""

    def __init__(self) -> None:
        #: Open calls: id → (name, summary), oldest first.
        self._open: dict[str, tuple[str, str]] = {}
        #: Ended calls (an update after the end posts nothing).
        self._ended: set[str] = set()
        #: How many calls were announced this turn.
        self.announced = 0

    def call(self, update: dict[str, Any]) -> list[ToolEvent]:
        """A ``tool_call`` (or a call first seen elsewhere, with its title)."""
        call_id = update.get("toolCallId")
        if not isinstance(call_id, str) or not call_id or call_id in self._ended:
            return []
        if call_id in self._open:
            return self.update(update)  # announced already (by a permission)
        kind = update.get("kind")
        name = KIND_NAMES.get(kind, "Tool") if isinstance(kind, str) else "Tool"
        title = update.get("title")
        summary = one_line(title) if isinstance(title, str) else ""
        self.announced += 1
        events = [ToolEvent(id=call_id, name=name, state="calling", summary=summary)]
        self._open[call_id] = (name, summary)
        ended = self._ending(call_id, update.get("status"))
        if ended is not None:
            events.append(ended)
        return events

    def update(self, update: dict[str, Any]) -> list[ToolEvent]:
        """A ``tool_call_update``."""
        call_id = update.get("toolCallId")
        title = update.get("title")
        if not isinstance(call_id, str) or call_id in self._ended:
            return []
        if call_id not in self._open:
            # Never announced by a tool_call: with a title it is announced now;
            # without one, an ending alone would dangle on the timeline.
            return self.call(update) if isinstance(title, str) and title else []
        if isinstance(title, str) and title.strip():
            self._open[call_id] = (self._open[call_id][0], one_line(title))
        ended = self._ending(call_id, update.get("status"))
        return [ended] if ended is not None else []

    def close_all(self) -> list[ToolEvent]:
        """The turn is over: every call still open ends as an error."""
        events = [ToolEvent(id=call_id, name=name, state="error", summary=summary)
                  for call_id, (name, summary) in self._open.items()]
        self._ended.update(self._open)
        self._open.clear()
        return events

    def activity(self) -> str:
        """The latest open call, for heartbeats ("Execute: pytest -q"), else thinking."""
        if self._open:
            return activity(*next(reversed(self._open.values())))
        return "thinking"

    def _ending(self, call_id: str, status: object) -> ToolEvent | None:
        if status not in ("completed", "failed"):
            return None
        name, summary = self._open.pop(call_id)
        self._ended.add(call_id)
        state: ToolState = "done" if status == "completed" else "error"
        return ToolEvent(id=call_id, name=name, state=state, summary=summary)
