"""The ledger's values: run states and the moves between them, rows, recovery,
admission answers, counters, and :class:`LedgerError`.
"""

from __future__ import annotations

import enum
from typing import Any

import attrs


class LedgerError(Exception):
    """The ledger cannot be used, or a caller asked for something impossible.

    Raised for a file that is not a ledger, one written by a newer prohost, a disk or
    sqlite failure, and for harness bugs: an unknown ``run_id`` or a state change that
    would move a run backwards.
    """


class LedgerOrderError(LedgerError):
    """A step the ledger refuses whatever the disk does: the run is not in the
    ledger, or the step would move it backwards (a harness bug, or a race such as a
    drop with a report that just settled). Trying it again cannot help."""


class RunState(enum.StrEnum):
    """Where a run is in its life; it only ever moves forward through these."""

    ACCEPTED = "accepted"
    STARTED = "started"
    FINISHED = "finished"
    REPORTED = "reported"


# The moves a run may make. A queued run cancelled before it starts goes straight to
# FINISHED (its outcome still has to be posted); a run dropped without a report
# (heartbeat_ack.unknown) goes to REPORTED from wherever it is.
_ALLOWED: dict[RunState, frozenset[RunState]] = {
    RunState.STARTED: frozenset({RunState.ACCEPTED}),
    RunState.FINISHED: frozenset({RunState.ACCEPTED, RunState.STARTED}),
    RunState.REPORTED: frozenset({RunState.ACCEPTED, RunState.STARTED, RunState.FINISHED}),
}


@attrs.frozen
class LedgerRow:
    """One run as the ledger holds it."""

    run_id: str
    lane: str
    body: str
    """The delivery's raw body text, exactly as it was signed."""
    state: RunState
    seq: int
    """Accept order: larger was accepted later. A counter, never the wall clock."""
    accepted_at: float
    started_at: float | None
    pgid: int | None
    """The agent's process group, once spawned (see :mod:`prohost.engine.agent.procinfo`)."""
    outcome: str | None
    """The outcome to post, as ``prohost.wire.runs.Outcome.to_json`` text, once finished."""
    reported_at: float | None
    settlement: str | None
    """How the report settled (free text, for people)."""
    finished_at: float | None = None
    start_state: str | None = None
    """What the run's checkouts were as it began (JSON, kept with its agent's process
    group; ``None`` without ``--repos``, before the spawn, once finished, and in the
    rows of an earlier prohost): a restart reports what it changed since."""


class Admitted(enum.Enum):
    """What :meth:`Ledger.admit` found, which decides the delivery's ack (§3)."""

    NEW = "new"
    """Not seen before; now recorded as accepted. Ack 200 and queue it."""
    HELD = "held"
    """Already in the ledger and not yet reported. Ack 200; do not queue it again."""
    REPORTED = "reported"
    """Already reported. Ack 204."""


@attrs.frozen
class UnreportedRuns:
    """What a start after a crash finds in the ledger (§7), each list in accept order."""

    pending: list[LedgerRow]
    """Accepted, never started: run them again, in this order."""
    interrupted: list[LedgerRow]
    """Started, not finished: never run again; kill a surviving agent, report a retryable
    failure."""
    outbox: list[LedgerRow]
    """Finished, not reported: post the saved outcome."""


_COLUMNS = (
    "run_id, lane, body, state, seq, accepted_at, started_at, pgid, outcome, "
    "reported_at, settlement, finished_at, start_state"
)


def _row(values: tuple[Any, ...]) -> LedgerRow:
    (run_id, lane, body, state, seq, accepted_at, started_at, pgid, outcome,
     reported_at, settlement, finished_at, start_state) = values
    return LedgerRow(
        run_id=run_id,
        lane=lane,
        body=body,
        state=RunState(state),
        seq=seq,
        accepted_at=accepted_at,
        started_at=started_at,
        pgid=pgid,
        outcome=outcome,
        reported_at=reported_at,
        settlement=settlement,
        finished_at=finished_at,
        start_state=start_state,
    )


@attrs.frozen
class LedgerStatistics:
    """Counters of one open ledger, for benchmarks and tests. (How many commits,
    and how many fsync'd, is sqlite's to say: tests count them with
    ``set_trace_callback``.)"""

    queued: int
    """Writes waiting for a writer now."""
    writes: int
    """Writes settled (committed, or failed) since the ledger was opened."""


