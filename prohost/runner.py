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
from prohost.brains.base import one_line
from prohost.execute import ExecSpec, Progress, execute, scratch_folder
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
#: Of an unexpected exception's message, this many characters go into the
#: completion's ``error`` (the traceback is in the log).
INTERNAL_ERROR_CHARS = 300


def _no_slot() -> None:
    """``Runner.run`` without a scheduler slot to give back."""


async def _post_timeline(
    batcher: TimelineBatcher, run_id: str, *, task_status: trio.TaskStatus[None]
) -> None:
    """The batcher's task. The timeline is best effort: a failure in it is logged
    and never takes the run (or its report) with it. Cancelled: as ``batcher.run``."""
    try:
        await batcher.run(task_status=task_status)
    except Exception:
        log.exception("run %s: the timeline stopped; the run goes on without it", run_id)


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

    async def run(self, held: HeldRun, *, release_slot: Callable[[], None] = _no_slot) -> None:
        """Execute ``held`` and settle its report.

        Whatever goes wrong inside (a ledger read, a worktree, the spawn, a brain's
        parser), the run is reported: an exception other than cancellation becomes
        the outcome ``internal error: <type>: <message>`` (retryable), logged with
        its traceback. ``release_slot`` is called once the agent has ended and the
        outcome is durable (``finished``), before the report: the slot is for the
        agent, the lane is held until the report settles (§4).

        Cancelling ``held.exec_scope`` stops the agent and reports
        ``held.stop_outcome``; cancelling ``held.life_scope`` (with ``held.dropped``)
        stops everything and records the run as dropped. Cancelled from outside,
        the agent is stopped and the ledger keeps the run where it was, for the next
        start to pick up; the slot is released either way.
        """
        run = held.run
        try:
            with held.life_scope:
                batcher = None
                if run.timeline_path is not None and self.brain.streams:
                    batcher = TimelineBatcher(self.reporter, run.run_id, run.timeline_path)
                async with trio.open_nursery() as nursery:
                    if batcher is not None:
                        await nursery.start(_post_timeline, batcher, run.run_id)
                    outcome = await self._outcome_of(held, batcher)
                    await self._finish(held, outcome)
                    # The agent has ended and its outcome is in the outbox: another
                    # lane may have the slot while this one is reported.
                    release_slot()
                    if batcher is not None:
                        # Every tool row is posted before the completion (§8).
                        await batcher.close()
                    nursery.cancel_scope.cancel()
                await self._report(held, outcome)
        finally:
            release_slot()
        if held.dropped:
            await self.record_dropped(held)

    async def settle_only(self, held: HeldRun, outcome: Outcome, *, recorded: bool) -> None:
        """Report a run that will not (or did not, in this process) execute.

        ``recorded``: the outcome is already in the ledger (a restart's outbox).
        Cancellation as for :meth:`run`.
        """
        with held.life_scope:
            if not recorded:
                await self._finish(held, outcome)
            else:
                held.state = "reporting"
                self._on_outcome(held, outcome)
            await self._report(held, outcome)
        if held.dropped:
            await self.record_dropped(held)

    async def record_dropped(self, held: HeldRun) -> None:
        """Close the run in the ledger without a report (it is closed on the server).
        Shielded and bounded, like every ledger step."""
        await self._ledger(self.ledger.mark_reported, held.run_id,
                           "dropped: closed on the server", time.time())

    async def _outcome_of(self, held: HeldRun, batcher: TimelineBatcher | None) -> Outcome:
        """The run's outcome; never raises but for cancellation (see :meth:`run`).

        Cancelled: as :meth:`_execute`; the lane's session is not touched.
        """
        try:
            outcome = await self._execute(held, batcher)
        except Exception as exc:
            outcome = self._internal_error(held, exc)
        if held.progress.attempts:
            # The lane's next turn resumes whatever session this one ended with,
            # failed or not; a rejected session that was replaced is forgotten
            # here too. A run whose agent never started leaves the lane's session
            # as it was: nothing happened to it.
            try:
                await self._ledger(self.ledger.save_session, held.run.lane, outcome.session_id,
                                   time.time())
            except Exception:
                log.exception("run %s: could not save the session of %s", held.run_id,
                              held.run.lane)
        return outcome

    def _internal_error(self, held: HeldRun, exc: BaseException) -> Outcome:
        """An exception no step expected, as the outcome the server hears (§7): the
        run is retryable, since the fault is ours and not the request's."""
        # A nursery's group of one is that one exception.
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]
        log.error("run %s failed inside the harness; reporting it as an internal error",
                  held.run_id, exc_info=exc)
        message = one_line(str(exc), INTERNAL_ERROR_CHARS)
        for secret in self.spec.secrets:
            if secret:
                message = message.replace(secret, "<secret>")
        error = f"internal error: {type(exc).__name__}: {message}" if message else \
            f"internal error: {type(exc).__name__}"
        return Outcome.failure(error, retryable=True, session_id=held.progress.session_id)

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
                # Named by a digest of the run id, never the id itself (§3).
                scratch=scratch_folder(self.scratch_root, run.run_id),
                worktrees=self.worktrees,
            )
        if outcome is None:  # the exec scope was cancelled: a cancel or a stop
            if held.stop_outcome is None:
                raise RuntimeError(f"harness bug: run {run.run_id} was stopped without "
                                   "an outcome to report")
            outcome = attrs.evolve(held.stop_outcome, session_id=held.progress.session_id)
        return outcome

    async def _finish(self, held: HeldRun, outcome: Outcome) -> None:
        """Books, logs and the ``finished`` step (the outcome is now in the outbox).

        Never raises but for cancellation: a ledger failure is logged and the run
        is reported all the same, since the server hearing it matters most.
        """
        run = held.run
        held.state = "reporting"
        self._on_outcome(held, outcome)
        try:
            await self._ledger(self.ledger.mark_finished, run.run_id, outcome.to_json(),
                               time.time())
        except Exception:
            log.exception("run %s: could not record its outcome; reporting it anyway",
                          run.run_id)

    async def _report(self, held: HeldRun, outcome: Outcome) -> None:
        """Post the outcome and record how that went (``reported``).

        Never raises but for cancellation (then nothing more is recorded, and the
        ledger's saved outcome is still the outbox). If posting fails unexpectedly,
        the run stays ``finished`` so that the next start posts it again.
        """
        run = held.run
        try:
            settlement = await self.reporter.complete(
                run.run_id, run.completion_path, outcome.completion(run.run_id)
            )
        except Exception:
            log.exception("run %s could not be reported; it stays in the ledger's outbox "
                          "and is reported at the next start", run.run_id)
            return
        # The reporter already said how a normal settlement went.
        level = logging.DEBUG if settlement.kind in ("delivered", "already") else logging.WARNING
        log.log(level, "reported run %s: %s", run.run_id, settlement.detail)
        try:
            await self._ledger(self.ledger.mark_reported, run.run_id,
                               f"{settlement.kind}: {settlement.detail}", time.time())
        except Exception:
            log.exception("run %s was reported but that could not be recorded; the next "
                          "start reports it again (the server takes it as a duplicate)",
                          run.run_id)

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
