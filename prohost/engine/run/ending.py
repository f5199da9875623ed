"""How a run ended, as the one outcome the server hears (§7): :class:`Ending`, made by
the runner from whoever ended the run (a reply, a failure, a cancel, a stop), with
what the run changed and spent so far kept in its :class:`Tally` (a stopped run
carries them too); and an agent's ending when its CLI said nothing itself (a
timeout, a signal, an exit status; the sentences are :mod:`prohost.wire.outcomes`)."""

from __future__ import annotations

import json
import logging
import signal
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol, runtime_checkable

import attrs

from prohost.engine.agent.brains.base import one_line
from prohost.engine.agent.process import ProcessResult
from prohost.engine.ledger.steps import LaneTurn
from prohost.engine.run.checkouts import LaneCheckouts
from prohost.engine.run.heldrun import Interrupted
from prohost.engine.run.startstate import UnreadableStartState
from prohost.wire.changes import ChangeEntry
from prohost.wire.outcomes import (
    NO_READABLE_REPLY,
    exited_with,
    killed_by,
    printed_nothing,
    ran_too_long,
)
from prohost.wire.runs import Outcome
from prohost.wire.usage import Usage

log = logging.getLogger("prohost.runner")


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def failure_from_result(result: ProcessResult, *, timeout_s: float,
                        idle_timeout_s: float, last_error: str | None = None) -> Outcome:
    """How the agent's process ended, in words, when its brain had nothing to say
    (a timeout, a signal, an exit status), given the run's ``--timeout`` and
    ``--idle-timeout``; a timeout also names the CLI's ``last_error``, if it
    reported one (Codex's "Reconnecting… waiting for network": it tells the sender
    why). ``duration_ms`` is set by the caller."""
    duration_ms = round(result.duration_s * 1000)
    said = f"; its last error: {one_line(last_error, 300)}" if last_error else ""
    if result.timed_out == "total":
        return Outcome.failure(ran_too_long(timeout_s) + said, duration_ms=duration_ms)
    if result.timed_out == "idle":
        return Outcome.failure(printed_nothing(idle_timeout_s) + said, duration_ms=duration_ms)
    if result.signal is not None:
        return Outcome.failure(killed_by(signal_name(result.signal), result.last_stderr_line),
                               duration_ms=duration_ms)
    if result.exit_code != 0:
        return Outcome.failure(exited_with(result.exit_code, result.last_stderr_line),
                               duration_ms=duration_ms)
    # Exit 0 and still no outcome: a brain that could not make sense of the output.
    return Outcome.failure(NO_READABLE_REPLY, duration_ms=duration_ms)


@attrs.define
class Tally:
    """What the run's attempts so far add up to, kept while they go on (an
    exception or a cancel still finds it)."""

    #: Every attempt's usage, summed (§7: the run's ``usage`` is all of them).
    spent: Usage = attrs.field(factory=Usage)
    #: The last finished attempt's session running totals (a CLI reporting those).
    totals: Usage | None = None
    #: The attempt under way (or last made), for a CLI reporting running totals:
    #: the session it resumed, what that session had reached before, and the
    #: account's environment (where the CLI keeps its sessions).
    attempt: tuple[str | None, Usage | None, Mapping[str, str]] | None = None
    #: When the run began (trio time, at ``started``), for its ``duration_ms``;
    #: ``None``: it never began.
    began: float | None = None
    #: What the run changed in its checkouts, read when asked (§7 ``changes``:
    #: every completion carries it, a cancelled or stopped run's too); ``None``:
    #: the run has no checkouts (yet).
    changes: Callable[[], Awaitable[list[ChangeEntry] | None]] | None = None


@runtime_checkable
class RecordsTotals(Protocol):
    """A brain whose CLI also records its session's running totals on disk, so a
    turn that printed none (failed, timed out, stopped) can still be counted
    (:meth:`prohost.engine.agent.brains.codex.CodexBrain.recorded_totals`)."""

    def recorded_totals(self, session_id: str, env: Mapping[str, str]) -> Usage | None: ...


@attrs.frozen
class Ending:
    """How a run ended, before it is the one :class:`Outcome` reported: the words
    of whoever ended it (``said``), and what the runner adds."""

    said: Outcome
    #: An attempt was made: the outcome names its account, and the lane's turn
    #: (its session, and that session's totals) is saved with ``finished``.
    ran: bool = False
    session_id: str | None = None
    account: str | None = None
    totals: Usage | None = None
    #: The run's usage, duration (ms) and changes; ``None``: none to add (a run
    #: stopped or never begun keeps what ``said`` has).
    usage: Usage | None = None
    duration_ms: int | None = None
    changes: list[ChangeEntry] | None = None
    #: The last account reached its usage limit: someone may still use the answer
    #: from another account, later (a limit is never the run's own fault).
    limited: bool = False
    #: The run's agent was spawned confined or not (§13); ``None``: none spawned.
    confined: bool | None = None

    def outcome(self) -> Outcome:
        """The outcome reported: made here, and only here, from what ended the run."""
        said = self.said
        return attrs.evolve(
            said,
            session_id=self.session_id,
            account=self.account if self.ran else said.account,
            usage=said.usage if self.usage is None else self.usage.known(),
            duration_ms=said.duration_ms if self.duration_ms is None else self.duration_ms,
            changes=said.changes if self.changes is None else self.changes,
            retryable=said.retryable or self.limited,
            confined=said.confined if self.confined is None else self.confined,
        )

    def lane_turn(self, lane: str) -> LaneTurn | None:
        """What the lane keeps of this run (``None``: no agent was tried, so the
        lane's session stays as it was)."""
        if not self.ran or self.account is None:
            return None
        totals = None if self.totals is None else json.dumps(self.totals.to_json())
        # The lane's next turn resumes whatever session this one ended with, failed
        # or not; a rejected session that was replaced is forgotten here too.
        return LaneTurn(lane, self.account, self.session_id, totals)


async def since_restart(run_id: str, said: Outcome, since: Interrupted,
                        checkouts: LaneCheckouts | None) -> Outcome:
    """The outcome of a run an earlier process of the harness started and a restart
    found unfinished (``said``: "restarted", or the cancel the ledger kept), told
    like every other ending (§7): how long it ran, from its start until the restart
    found it (the ledger does not know when it ended, and its agent may have
    outlived the harness until then), and, with ``checkouts`` (``--repos``), what it
    changed since it began, read by :meth:`LaneCheckouts.changes` from the start
    state the ledger kept. Its usage went with the harness that read the agent's
    output: the lane's next turn says so where its CLI counts running totals
    (``includes_earlier_turns``).

    Cancelled: as :meth:`LaneCheckouts.changes`; nothing is kept.
    """
    duration_ms = said.duration_ms
    if duration_ms is None and since.started_at is not None:
        duration_ms = max(0, round((since.found_at - since.started_at) * 1000))
    changes = said.changes
    if changes is None and checkouts is not None:
        changes = await _changes_since(run_id, since, checkouts)
    return attrs.evolve(said, duration_ms=duration_ms, changes=changes)


async def _changes_since(run_id: str, since: Interrupted,
                         checkouts: LaneCheckouts) -> list[ChangeEntry] | None:
    """What the run changed since the ledger's start state; ``None`` (logged) when
    the ledger has none, or one this prohost cannot read."""
    if since.start_state is None:
        log.warning("run %s: the ledger does not say what its checkouts were when it "
                    "began (it began under an earlier prohost, or the harness stopped "
                    "before its agent was spawned), so its report carries no changes",
                    run_id)
        return None
    try:
        checkouts.resume(since.start_state)
        return await checkouts.changes()
    except UnreadableStartState as exc:
        log.warning("run %s: %s, so its report carries no changes", run_id, exc)
    except Exception:  # the report goes on without them: logged
        log.exception("run %s: could not read what it changed", run_id)
    return None
