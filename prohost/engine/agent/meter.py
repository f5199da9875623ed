"""What a run's attempts spent, as each brain's CLI lets it be counted (§7 ``usage``).

A CLI that says each turn's own usage (Claude Code's result event) needs nothing
kept: an attempt's usage is what it said (:class:`UsageMeter`). A CLI that reports
its session's *running totals* (Codex; an ACP agent whose cost is a running total)
needs what the session had reached before the attempt, to subtract, and, when a
turn printed nothing (stopped, failed, timed out), where the CLI recorded its
totals on disk (:class:`RunningTotals`). The run room asks :func:`meter_for` for the
brain's meter and never looks at which brain it is.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol, runtime_checkable

import attrs

from prohost.engine.agent.brains.base import Brain
from prohost.engine.blocking import Bounds
from prohost.wire.usage import Usage

log = logging.getLogger("prohost.runner")

__all__ = ["AttemptTotals", "RecordsTotals", "RunningTotals", "UsageMeter", "meter_for"]


@runtime_checkable
class RecordsTotals(Protocol):
    """A brain whose CLI also records its session's running totals on disk, so a
    turn that printed none (failed, timed out, stopped) can still be counted
    (:meth:`prohost.engine.agent.brains.codex.CodexBrain.recorded_totals`)."""

    def recorded_totals(self, session_id: str, env: Mapping[str, str]) -> Usage | None: ...


@attrs.define
class AttemptTotals:
    """The run's running-totals state, kept while its attempts go on (an exception
    or a cancel still finds it): the last finished attempt's session totals, and the
    attempt under way (the session it resumed, what that session had reached
    before, and the account's environment, where the CLI keeps its sessions)."""

    totals: Usage | None = None
    attempt: tuple[str | None, Usage | None, Mapping[str, str]] | None = None


class UsageMeter:
    """For a CLI that says each turn's own usage: nothing before an attempt, and a
    turn that printed nothing spent nothing known."""

    async def before(self, run_id: str, session: str | None, env: Mapping[str, str],
                     kept: AttemptTotals) -> Usage | None:
        """What the resumed ``session`` had reached, for the attempt to subtract
        (``None``: nothing to subtract), noted in ``kept``. Cancelled: a read
        abandoned, nothing to undo."""
        kept.totals = None
        return None

    async def unreported(self, run_id: str, session_id: str,
                         kept: AttemptTotals) -> Usage | None:
        """The attempt's share of its session's totals when its CLI printed none;
        ``None``: not known. Cancelled: a read abandoned, nothing to undo."""
        return None


class RunningTotals(UsageMeter):
    """For a CLI that reports its session's running totals: ``read_totals`` reads
    what a session had reached (the ledger's, kept with the lane's turns), and a
    brain that :class:`RecordsTotals` is asked where its CLI recorded them."""

    def __init__(self, brain: Brain, read_totals: Callable[[str, str], Awaitable[Usage]],
                 bounds: Bounds) -> None:
        self._brain = brain
        self._read_totals = read_totals
        self._bounds = bounds

    async def before(self, run_id: str, session: str | None, env: Mapping[str, str],
                     kept: AttemptTotals) -> Usage | None:
        """As :meth:`UsageMeter.before`; the totals read for a resumed session."""
        before = await self._read_totals(run_id, session) if session is not None else None
        kept.totals = None
        kept.attempt = (session, before, env)
        return before

    async def unreported(self, run_id: str, session_id: str,
                         kept: AttemptTotals) -> Usage | None:
        """This attempt's share of ``session_id``'s running totals when its CLI
        printed none (Codex reports a turn's usage only when it completes): read
        from where the CLI records them (Codex's session rollout file), less what
        the session had reached before (§7), and ``kept.totals`` set to them. When
        they cannot be read, ``None``, and ``kept.totals`` says the session went on
        from the last known totals, so that the next turn's difference, which then
        holds this one's tokens too, says so (``includes_earlier_turns``).

        Cancelled: as :meth:`prohost.engine.blocking.Bounds.file_step` (a read).
        """
        if kept.attempt is None:  # no attempt made yet
            return None
        resumed, before, env = kept.attempt
        known = before if session_id == resumed and before is not None else Usage()
        recorded = None
        if isinstance(self._brain, RecordsTotals):
            try:
                # Abandoning it is safe: a read of the CLI's own file.
                recorded = await self._bounds.file_step(
                    self._brain.recorded_totals, session_id, env,
                    what="reading the agent's session totals", limit_s=5.0)
            except OSError as exc:
                log.warning("run %s: could not read session %s's totals where the "
                            "agent records them: %s", run_id, session_id, exc)
        if recorded is None:
            kept.totals = attrs.evolve(known, includes_earlier_turns=True)
            return None
        kept.totals = recorded
        earlier = True if known.includes_earlier_turns else None
        return attrs.evolve(recorded.since(known), turns=1, includes_earlier_turns=earlier)


def meter_for(brain: Brain, read_totals: Callable[[str, str], Awaitable[Usage]],
              bounds: Bounds) -> UsageMeter:
    """The meter for ``brain``'s CLI (see the module docstring)."""
    if brain.running_totals:
        return RunningTotals(brain, read_totals, bounds)
    return UsageMeter()
