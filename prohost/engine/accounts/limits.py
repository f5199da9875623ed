"""What one attempt learned about its account's usage limit (docs/protocol.md §12): the
account book's input. Reading it out of what a CLI prints is the agent's job
(:mod:`prohost.engine.agent.limits`); this module holds only the notice and how
two notices of one attempt combine, so the book needs nothing of the agent.
"""

from __future__ import annotations

from typing import Literal

import attrs

LimitState = Literal["ok", "warning", "limited"]

_SEVERITY: dict[str, int] = {"ok": 0, "warning": 1, "limited": 2}


@attrs.frozen
class LimitNotice:
    """What one attempt learned about its account's usage limit."""

    #: ``limited``: the CLI refused work until ``resets_at``; ``warning``: close to it.
    state: LimitState
    #: When the limit resets, epoch seconds; ``None`` when the CLI did not say.
    resets_at: float | None = None
    #: How much of the window is used, 0–100; ``None`` when not reported.
    used_percent: float | None = None
    #: Where it was read ("claude rate_limit_event five_hour", "codex error"…).
    source: str = ""

    def then(self, later: LimitNotice | None) -> LimitNotice:
        """This notice updated by a ``later`` one from the same attempt.

        A refusal is not undone by a later, milder event of the same attempt
        (Claude sends ``allowed`` events for other windows after a ``rejected``);
        figures missing from the later notice are kept from this one.
        """
        if later is None:
            return self
        keep = _SEVERITY[self.state] > _SEVERITY[later.state]
        first, second = (later, self) if keep else (self, later)
        # A reset time belongs to its state: an "allowed" window's reset says
        # nothing about when a refusal ends.
        borrowed = first.resets_at if first.state == second.state else None
        return attrs.evolve(
            second,
            resets_at=second.resets_at if second.resets_at is not None else borrowed,
            used_percent=(
                second.used_percent if second.used_percent is not None else first.used_percent
            ),
        )


def merge(earlier: LimitNotice | None, later: LimitNotice | None) -> LimitNotice | None:
    """``earlier.then(later)`` where either may be missing."""
    if earlier is None:
        return later
    return earlier.then(later)
