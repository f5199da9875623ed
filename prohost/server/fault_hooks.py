"""The soak's fault hooks' settings and counters (:mod:`prohost.server.faults` acts on
them): a leaf the server's state keeps, so that the faults may import the state
and not the other way round."""

from __future__ import annotations

from typing import Any

import attrs
import trio


@attrs.define(eq=False)
class FaultHooks:
    """The soak's hooks' settings and counters (all off by default)."""

    #: The ``/v1/faults`` routes exist only when this is set.
    enabled: bool = False
    #: Valid completions still to answer 200 and drop, and runs whose next one is.
    forget_next: int = 0
    forget_runs: set[str] = attrs.field(factory=set)
    forgotten: int = 0
    drops: int = 0
    storms: int = 0
    restarts: int = 0
    #: False while a restart keeps the port closed.
    listening: bool = True
    #: Set to ask the listener to restart; it waits ``restart_down_s`` then listens.
    restart_requested: trio.Event = attrs.field(factory=trio.Event)
    restart_down_s: float = 0.0
    #: Runs whose completion POSTs wait for a release, and how many wait now.
    hold_runs: set[str] = attrs.field(factory=set)
    held_posts: dict[str, int] = attrs.field(factory=dict)

    def take_forget(self, run_id: str) -> bool:
        """Whether this valid completion of ``run_id`` is to be dropped (counts it)."""
        if run_id in self.forget_runs:
            self.forget_runs.discard(run_id)
        elif self.forget_next > 0:
            self.forget_next -= 1
        else:
            return False
        self.forgotten += 1
        return True

    def view(self, completion_faults: int) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "storm_left": completion_faults,
            "forget_next": self.forget_next,
            "forget_runs": sorted(self.forget_runs),
            "forgotten": self.forgotten,
            "drops": self.drops,
            "storms": self.storms,
            "restarts": self.restarts,
            "listening": self.listening,
        }
