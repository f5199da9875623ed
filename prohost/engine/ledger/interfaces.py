"""What each part of the harness may ask of the ledger: one narrow interface per
consumer of :class:`~prohost.engine.ledger.steps.LedgerSteps`, as httpcore's
``interfaces.py`` gives each layer only what it uses.

:class:`LedgerSteps` is the one implementation (``mypy --strict`` checks that it
satisfies every protocol here, where the harness hands it over); each consumer is
typed with its protocol, so it cannot reach a step that is not its job (the outbox
cannot admit a run, admission cannot mark one finished), and a test's stand-in needs
only that protocol's few methods. ``tests/engine/ledger/test_interfaces.py`` keeps
each protocol exactly what its consumer calls, and all of them together the whole of
:class:`LedgerSteps`.

Each method's contract (durability, bound, what is raised, what a cancel does) is
the one of the same name on :class:`LedgerSteps`; it is not repeated here.

==============  =====================================  ================================
protocol        consumer                               its steps
==============  =====================================  ================================
AdmissionSteps  ``supervisor/admission.py`` Admission   stalled, known, admit,
                                                       under_way, settled
PruneSteps      ``supervisor/upkeep.py`` ``prune``      prune
DailySteps      ``supervisor/upkeep.py`` DailyPass      lanes_last_used; prune
RecoverySteps   ``supervisor/recovery.py`` Recovery     unreported, account_limits,
                                                       finished_since, interrupted_turn,
                                                       close_unreadable, lookup; prune
OutboxSteps     ``report/outbox.py`` Outbox             lookup, reported
AttemptSteps    ``run/attempts.py`` Attempts            lane_account, account_session,
                                                       session_totals, record_pgid
RunSteps        ``run/runner.py`` Runner                read_body, started, finished,
                                                       reported
==============  =====================================  ================================

The harness, which makes the steps and hands each consumer its part, keeps the
concrete class for the three steps that are its own: ``writer`` (the writer
thread's life), ``cancelled`` (a server's cancel kept) and ``save_limits`` (given to
the account gate as a callable).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from prohost.engine.ledger import Admitted, LedgerRow, UnreportedRuns
    from prohost.engine.ledger.steps import LaneTurn
    from prohost.engine.ledger.store import AdmitTicket


class AdmissionSteps(Protocol):
    """A delivery to its ack (§3): the ledger's answer before any 503, then the
    durable ``accepted``."""

    def stalled(self) -> bool: ...

    async def known(self, run_id: str) -> LedgerRow | None: ...

    async def admit(self, run_id: str, lane: str, body: str) -> Admitted: ...

    def under_way(self, run_id: str) -> list[AdmitTicket]: ...

    async def settled(self, tickets: list[AdmitTicket]) -> None: ...


class PruneSteps(Protocol):
    """The daily retention pass: reported runs forgotten."""

    async def prune(self, older_than_s: float) -> int: ...


class DailySteps(PruneSteps, Protocol):
    """The daily pass: reported runs forgotten, and when each conversation last had a
    run (its agent folders are collected after a time without one)."""

    async def lanes_last_used(self) -> dict[str, float]: ...


class RecoverySteps(PruneSteps, Protocol):
    """A start's reading of the ledger (§7), which ends with a prune; the end-of-drain
    sweep; a redelivered run nobody holds."""

    async def unreported(self, what: str) -> UnreportedRuns: ...

    async def account_limits(self) -> dict[str, float]: ...

    async def finished_since(self, since: float) -> list[tuple[float, str]]: ...

    async def interrupted_turn(self, lane: str) -> None: ...

    async def cancelled(self, run_id: str, outcome_json: str) -> None: ...

    async def close_unreadable(self, run_id: str, why: str) -> None: ...

    async def lookup(self, run_id: str) -> LedgerRow | None: ...


class OutboxSteps(Protocol):
    """Reports that outlived their retry window: the saved outcome read back, and
    how the report settled."""

    async def lookup(self, run_id: str) -> LedgerRow | None: ...

    async def reported(self, run_id: str, settlement: str) -> None: ...


class AttemptSteps(Protocol):
    """A run's attempts: the lane's account and session, a session's totals, and the
    spawned agent's process group."""

    async def lane_account(self, lane: str) -> str | None: ...

    async def account_session(self, lane: str, account: str) -> str | None: ...

    async def session_totals(self, session_id: str) -> str | None: ...

    async def record_pgid(self, run_id: str, pgid: int, start_state: str | None = None
                          ) -> None: ...


class RunSteps(Protocol):
    """A run from dispatch to its report: its body, ``started``, ``finished`` and
    ``reported``, in that order."""

    async def read_body(self, run_id: str) -> str | None: ...

    async def started(self, run_id: str, lane: str, account: str) -> str | None: ...

    async def finished(self, run_id: str, outcome_json: str, turn: LaneTurn | None
                       ) -> None: ...

    async def reported(self, run_id: str, settlement: str) -> None: ...

