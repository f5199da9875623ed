"""A run as the harness holds it, from accept until its report settles (what
heartbeats and the panel list).

A queued run is kept light, because 10,000 of them may wait: its id, lane, state
and completion path, and at most the text its body was delivered in
(:mod:`prohost.engine.run.queued_bodies`). Its parsed body, its two cancel scopes and its
:class:`~prohost.engine.run.progress.Progress` come when it leaves the queue or is first
cancelled; a cancel that comes before the run starts is kept, and its agent never
starts.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import trio

from prohost.engine.run.progress import Progress, waiting_activity
from prohost.wire.protocol import RunBeat
from prohost.wire.runs import AgentRun, Outcome, conversation_of

if TYPE_CHECKING:
    from prohost.engine.agent.process import AgentWatch

__all__ = ["HeldRun", "Interrupted", "Phase", "ReportOnly"]


class Phase(enum.StrEnum):
    """Where a held run is (§2's states, as heartbeats list them): queued →
    preparing → running → reporting; a run reported without executing goes
    straight to reporting. A ``str``, so that it is the heartbeat's word as it is."""

    QUEUED = "queued"
    PREPARING = "preparing"
    RUNNING = "running"
    REPORTING = "reporting"


@attrs.frozen
class Interrupted:
    """A run an earlier process of the harness started and never finished (a ``kill
    -9``, a crash), as the restart that found it knows it: when it began and when it
    was found (epoch s), and what its checkouts were as it began (the ledger's JSON;
    ``None`` when it has none). Its report says what it changed and how long it ran
    (§7), like every other ending's."""

    started_at: float | None
    found_at: float
    start_state: str | None


@attrs.define(eq=False)
class HeldRun:
    """A run from accept until its report settles; what heartbeats list.

    A queued run is kept light: its id, lane and state, and at most the text its
    body was delivered in (:attr:`raw`). The body is parsed when the run leaves the
    queue, and its cancel scopes and :class:`Progress` are made when first used, so
    that 10,000 queued runs do not hold 10,000 parsed bodies (most of the harness's
    memory).
    """

    run_id: str
    lane: str
    #: The parsed body, once the run leaves the queue
    #: (:meth:`prohost.engine.run.queued_bodies.QueuedBodies.load`);
    #: ``None`` while it waits. Read it as :attr:`run`.
    body: AgentRun | None = None
    #: While queued: the body's text as delivered, if the queued runs' texts fit the
    #: harness's budget (:data:`prohost.engine.run.queued_bodies.QUEUED_TEXT_BUDGET_CHARS`
    #: by default); else ``None``, and the body is read back from the ledger (which
    #: has had it since before the ack).
    raw: str | None = None
    #: Changed through :meth:`move_to`: by the runner, and to ``reporting`` by the run
    #: queue for a run that will only be reported (:class:`ReportOnly`).
    state: Phase = Phase.QUEUED
    started_at: float | None = None
    stop_outcome: Outcome | None = None
    #: The run's last agent has exited and its outcome is known (set by the runner
    #: alone): a cancel or a stop that comes now changes nothing, and the run is
    #: reported as it finished (§6).
    agent_ended: bool = False
    #: The watch of the run's latest agent, until another may start (set by the
    #: runner alone, through :meth:`next_agent`): once its leader has exited
    #: (:attr:`agent_exited`) a cancel or a stop is kept, but waits for the
    #: runner's word — a run whose agent finished is finished (§6).
    agent: AgentWatch | None = None
    dropped: bool = False
    #: Set by a restart for a run an earlier process started and never finished.
    interrupted: Interrupted | None = None
    #: Where the run's report goes, kept while the body is not: a run whose body
    #: cannot be read back is still reported
    #: (``prohost.engine.run.queued_bodies.QueuedBodies.load``).
    completion_path: str | None = None
    # Made on first use (the properties below): a queued run has none of them.
    _exec_scope: trio.CancelScope | None = attrs.field(default=None, init=False)
    _life_scope: trio.CancelScope | None = attrs.field(default=None, init=False)
    _progress: Progress | None = attrs.field(default=None, init=False)

    @classmethod
    def of(cls, run: AgentRun) -> HeldRun:
        """A held run with its body (one about to be reported, or a test's)."""
        return cls(run.run_id, run.lane, run, completion_path=run.completion_path)

    @property
    def run(self) -> AgentRun:
        """The parsed body; only once it is loaded (the run has left the queue)."""
        if self.body is None:
            raise RuntimeError(f"harness bug: run {self.run_id} is used before its body "
                               "was read from the ledger")
        return self.body

    def move_to(self, state: Phase, changed: Callable[[], None]) -> None:
        """The run is now in ``state`` (see :class:`Phase`); ``changed`` is
        told, so heartbeats and the panel look again (also when the state stays: what
        goes with it, such as ``started_at``, may have changed). The runner's to
        call, and the run queue's for a run that will only be reported."""
        self.state = state
        changed()

    @property
    def agent_exited(self) -> bool:
        """The run's agent has exited (its leader, whatever ended it but a cancel),
        and no other may start since."""
        return self.agent is not None and self.agent.leader_exited

    def stop_agent(self) -> None:
        """Stop the run's agent for :attr:`stop_outcome` (set first): at once, unless
        its agent has just exited by itself. Then the run ends as its agent did,
        unless another agent would follow (a fail-over, a fresh session), which
        :meth:`next_agent` stops instead."""
        if not self.agent_exited:
            self.exec_scope.cancel()

    def next_agent(self, agent: AgentWatch | None = None) -> None:
        """The runner's word that another agent may start for the run (``agent``,
        just spawned, its output not read yet): a cancel or a stop kept since the
        last one exited stops the run now, and later ones at once until ``agent``'s
        leader exits (the runner's alone to call)."""
        self.agent = agent
        if self.stop_outcome is not None:
            self.exec_scope.cancel()

    @property
    def conversation_id(self) -> str | None:
        """The conversation of the run's lane (§4), without its body."""
        return conversation_of(self.lane)

    @property
    def exec_scope(self) -> trio.CancelScope:
        """Cancelled to stop the agent; the run is then reported with ``stop_outcome``.
        A cancel before the run starts is kept, and the run's agent never starts."""
        if self._exec_scope is None:
            self._exec_scope = trio.CancelScope()
        return self._exec_scope

    @property
    def life_scope(self) -> trio.CancelScope:
        """Cancelled to forget the run entirely (``heartbeat_ack.unknown``); kept,
        like :attr:`exec_scope`, when it comes before the run starts."""
        if self._life_scope is None:
            self._life_scope = trio.CancelScope()
        return self._life_scope

    @property
    def progress(self) -> Progress:
        """What the runner has learned so far (made by the first writer)."""
        if self._progress is None:
            self._progress = Progress()
        return self._progress

    @property
    def waiting_until(self) -> float | None:
        """While the run waits for an account's limit to reset: when (epoch s)."""
        return None if self._progress is None else self._progress.waiting_until

    def activity(self) -> str | None:
        """What the run is doing, for heartbeats and the panel."""
        progress = self._progress
        if progress is None:
            return None
        if progress.waiting_until is not None:
            return waiting_activity(progress.waiting_until)
        if self.state is Phase.PREPARING:  # what it prepares (its private checkouts, §5.1)
            return progress.preparing
        return progress.activity if self.state is Phase.RUNNING else None

    def beat(self) -> RunBeat:
        """This run's heartbeat entry; a queued run's is only its id and state (§2),
        so that 10,000 queued runs still make a heartbeat far below 4 MiB (one
        waiting for an account's limit to reset also says so, §12)."""
        if self.state is Phase.QUEUED:
            return RunBeat(run_id=self.run_id, state=self.state, activity=self.activity())
        progress = self._progress
        return RunBeat(
            run_id=self.run_id,
            state=self.state,
            lane=self.lane,
            started_at=self.started_at,
            activity=self.activity(),
            account=progress.account if progress is not None and progress.attempts else None,
        )


@attrs.frozen
class ReportOnly:
    """A held run that will not execute (or did not, in this process), only be
    reported: cancelled while queued, turned away by a drain or the queue cap, or
    recovered after a restart. The scheduler's other kind of item: it waits for its
    lane like any run and takes no slot (§4).

    ``recorded``: ``outcome`` is in the ledger already (a restart's outbox), since
    ``finished_at`` (epoch s).
    """

    held: HeldRun
    outcome: Outcome
    recorded: bool = False
    finished_at: float | None = None
