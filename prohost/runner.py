"""One run from dispatch to settled report, in its own cancel scopes (PROTOCOL.md §5–§7).

The supervisor (:mod:`prohost.harness`) decides *which* run goes and keeps the
books; this module does one run's steps, each written to the ledger before the
next begins::

    started → (worktrees, prompt, agent: prohost.execute) → finished → POST → reported

A :class:`HeldRun` carries two cancel scopes. ``exec_scope`` stops the agent and
the run is still reported (a ``cancel``, the second signal) with its
``stop_outcome``; ``life_scope`` stops everything, the report included (the server
said it no longer knows the run). Ledger steps are shielded and bounded, so a
cancel never leaves one half done.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs
import trio

from prohost.agentproc import ProcessGroups
from prohost.blocking import Bounds, StepTimedOut
from prohost.brains import Brain
from prohost.execute import ExecSpec, Progress, execute
from prohost.ledger import Ledger, LedgerError
from prohost.protocol import RunBeat
from prohost.reporter import Reporter
from prohost.runs import AgentRun, Outcome
from prohost.timeline import TimelineBatcher
from prohost.worktrees import WorktreeManager

log = logging.getLogger("prohost.runner")
#: A run's progress (accepted, started, finished). The status panel reports the
#: same changes, so with a panel attached this logger is turned down to warnings.
progress_log = logging.getLogger("prohost.harness.runs")

#: Bound on one ledger step (s). A step is a local fsync; if it takes longer, the
#: disk is in trouble, and the step is abandoned (prohost.blocking).
LEDGER_STEP_TIMEOUT_S = 30.0


@attrs.define(eq=False)
class HeldRun:
    """A run from accept until its report settles; what heartbeats list."""

    run: AgentRun
    state: str = "queued"  # queued | preparing | running | reporting
    started_at: float | None = None
    #: Cancelled to stop the agent; the run is then reported with ``stop_outcome``.
    exec_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    #: Cancelled to forget the run entirely (``heartbeat_ack.unknown``).
    life_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    stop_outcome: Outcome | None = None
    dropped: bool = False
    progress: Progress = attrs.field(factory=Progress)

    @property
    def run_id(self) -> str:
        return self.run.run_id

    def beat(self) -> RunBeat:
        """This run's heartbeat entry; a queued run's is only its id and state (§2),
        so that 10,000 queued runs still make a heartbeat far below 4 MiB."""
        if self.state == "queued":
            return RunBeat(run_id=self.run_id, state=self.state)
        return RunBeat(
            run_id=self.run_id,
            state=self.state,
            lane=self.run.lane,
            started_at=self.started_at,
            activity=self.progress.activity if self.state == "running" else None,
        )


class Runner:
    """Executes and reports runs; shared by every run of one harness."""

    def __init__(
        self,
        *,
        spec: ExecSpec,
        brain: Brain,
        ledger: Ledger,
        reporter: Reporter,
        groups: ProcessGroups,
        env: Mapping[str, str],
        worktrees: WorktreeManager | None,
        scratch_root: Path,
        on_change: Callable[[], None],
        on_outcome: Callable[[HeldRun, Outcome], None],
    ) -> None:
        self.spec = spec
        self.brain = brain
        self.ledger = ledger
        self.reporter = reporter
        self.groups = groups
        self.env = env
        self.worktrees = worktrees
        self.scratch_root = scratch_root
        self._on_change = on_change
        self._on_outcome = on_outcome
        #: Every blocking ledger step of this harness; the second signal hurries them.
        self.bounds = Bounds()

    async def run(self, held: HeldRun) -> None:
        """Execute ``held`` and settle its report.

        Cancelling ``held.exec_scope`` stops the agent and reports
        ``held.stop_outcome``; cancelling ``held.life_scope`` (with ``held.dropped``)
        stops everything and records the run as dropped. Cancelled from outside,
        the agent is stopped and the ledger keeps the run where it was, for the next
        start to pick up.
        """
        run = held.run
        with held.life_scope:
            batcher = None
            if run.timeline_path is not None and self.brain.streams:
                batcher = TimelineBatcher(self.reporter, run.run_id, run.timeline_path)
            async with trio.open_nursery() as nursery:
                if batcher is not None:
                    await nursery.start(batcher.run)
                outcome = await self._execute(held, batcher)
                if batcher is not None:
                    # Every tool row is posted before the completion (§8).
                    await batcher.close()
                nursery.cancel_scope.cancel()
            await self._settle(held, outcome)
        if held.dropped:
            await self.record_dropped(held)

    async def settle_only(self, held: HeldRun, outcome: Outcome, *, recorded: bool) -> None:
        """Report a run that will not (or did not, in this process) execute.

        ``recorded``: the outcome is already in the ledger (a restart's outbox).
        Cancellation as for :meth:`run`.
        """
        with held.life_scope:
            await self._settle(held, outcome, recorded=recorded)
        if held.dropped:
            await self.record_dropped(held)

    async def record_dropped(self, held: HeldRun) -> None:
        """Close the run in the ledger without a report (it is closed on the server).
        Shielded and bounded, like every ledger step."""
        await self._ledger(self.ledger.mark_reported, held.run_id,
                           "dropped: closed on the server", time.time())

    async def _execute(self, held: HeldRun, batcher: TimelineBatcher | None) -> Outcome:
        run = held.run
        ledger = self.ledger
        held.state = "preparing"
        outcome: Outcome | None = None
        with held.exec_scope:
            await self._ledger(ledger.mark_started, run.run_id, time.time())
            # Abandoning it on a hung disk is safe: a read under the ledger's lock
            # (see prohost.ledger); the run then fails with the StepTimedOut.
            session = await self.bounds.run(ledger.session_for, run.lane,
                                            limit_s=LEDGER_STEP_TIMEOUT_S,
                                            what="reading the lane's session from the ledger")
            held.state = "running"
            held.started_at = time.time()
            self._on_change()
            progress_log.info("▶ run %s started on %s%s", run.run_id, run.lane,
                              f" (resuming session {session})" if session else "")

            async def spawned(pgid: int) -> None:
                # With the group recorded, a restarted harness can find and kill
                # this agent if this process dies while it runs (§7).
                await self._ledger(ledger.record_pgid, run.run_id, pgid)

            outcome = await execute(
                run, self.spec, self.brain,
                groups=self.groups,
                session_id=session,
                progress=held.progress,
                on_spawn=spawned,
                on_events=batcher.add if batcher is not None else None,
                base_env=self.env,
                scratch=self.scratch_root / run.run_id,
                worktrees=self.worktrees,
            )
        if outcome is None:  # the exec scope was cancelled: a cancel or a stop
            assert held.stop_outcome is not None
            outcome = attrs.evolve(held.stop_outcome, session_id=held.progress.session_id)
        # The lane's next turn resumes whatever session this one ended with, failed
        # or not; a rejected session that was replaced is forgotten here too.
        await self._ledger(ledger.save_session, run.lane, outcome.session_id, time.time())
        return outcome

    async def _settle(self, held: HeldRun, outcome: Outcome, *, recorded: bool = False) -> None:
        """Record the outcome (the outbox), post it, record how that went."""
        run = held.run
        held.state = "reporting"
        self._on_outcome(held, outcome)
        if not recorded:
            await self._ledger(self.ledger.mark_finished, run.run_id, outcome.to_json(),
                               time.time())
        settlement = await self.reporter.complete(
            run.run_id, run.completion_path, outcome.completion(run.run_id)
        )
        # The reporter already said how a normal settlement went.
        level = logging.DEBUG if settlement.kind in ("delivered", "already") else logging.WARNING
        log.log(level, "reported run %s: %s", run.run_id, settlement.detail)
        await self._ledger(self.ledger.mark_reported, run.run_id,
                           f"{settlement.kind}: {settlement.detail}", time.time())

    async def _ledger(self, step: Callable[..., object], *args: object) -> None:
        """One durable ledger step, in a worker thread.

        Cancelled: not interrupted — a step that was begun is finished even when
        the run is being cancelled, or the ledger would disagree with what was
        done — but bounded: after LEDGER_STEP_TIMEOUT_S, or at the second signal's
        deadline, the step is abandoned and logged, and the run goes on; the next
        start finds the run wherever the ledger has it and reports it (§7).
        """
        name = getattr(step, "__name__", "step")
        try:
            # Abandoning is safe: each ledger method is one transaction under the
            # ledger's lock, which the abandoned thread completes or rolls back
            # alone (see prohost.ledger and prohost.blocking).
            await self.bounds.run(step, *args, limit_s=LEDGER_STEP_TIMEOUT_S,
                                  what=f"the ledger step {name}")
        except LedgerError as exc:
            # A step out of order (say, a drop racing a report that just
            # settled) must not take the run's task down with it.
            log.error("ledger: %s", exc)
        except StepTimedOut as exc:
            log.error("ledger: %s", exc)
