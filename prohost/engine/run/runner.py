"""One run from dispatch to settled report, in its own cancel scopes (docs/protocol.md §5–§7).

The supervisor (:mod:`prohost.engine.harness`) decides *which* run goes; the
:class:`Runner` owns the run from then on: its state, its steps in order (each
written to the ledger before the next begins), its account and the fail-over to
another, and the one place its outcome is finished::

    started → checkouts → prompt → attempt (execute) ─┬─ ended by a limit: next account
                                                       └─ else → finished → POST → reported

An attempt (:func:`prohost.engine.run.execute.execute`) is one account and one
session: it is handed a frozen :class:`~prohost.engine.run.execute.Attempt` and
returns an :class:`~prohost.engine.run.execute.AttemptResult`; between the agent's
spawn and its watch it awaits ``on_spawn`` (the process group's durable step, §7).

``started``, the agent's process group and ``finished`` wait for their fsync (a
``started`` or process group that cannot be written stops the run: §7); the lane's
session and ``reported`` ride the next commit (why each may, in
:mod:`prohost.engine.ledger`); every step is one named method of
:class:`~prohost.engine.ledger.steps.LedgerSteps`, bounded.

A :class:`~prohost.engine.run.heldrun.HeldRun` carries two cancel scopes. ``exec_scope``
stops the agent and the run is still reported (a ``cancel``, the second signal) with
its ``stop_outcome``; ``life_scope`` stops everything, the report included (the
server said it no longer knows the run). Ledger steps are shielded and bounded, so a
cancel never leaves one half done. Which account a run starts on, and the wait while
every account is limited (§12), are the :class:`~prohost.engine.accounts.gate.AccountGate`'s.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Protocol

import trio

from prohost.engine import lognames
from prohost.engine.accounts.book import Account
from prohost.engine.agent.brains.base import one_line
from prohost.engine.agent.reading import ToolEventSink
from prohost.engine.ledger.interfaces import RunSteps
from prohost.engine.ledger.steps import LaneTurn, StepNotWritten
from prohost.engine.report.outbox import Outbox
from prohost.engine.report.reporter import Reporter
from prohost.engine.report.timeline import TimelineBatcher
from prohost.engine.run.attempts import Attempts
from prohost.engine.run.ending import Ending, Tally, since_restart
from prohost.engine.run.execute import AgentSetup
from prohost.engine.run.heldrun import HeldRun, Phase
from prohost.engine.run.progress import Progress
from prohost.engine.run.queued_bodies import QueuedBodies
from prohost.engine.run.workspace import Workspaces
from prohost.wire.outcomes import internal_error, without_local_paths
from prohost.wire.runs import Outcome

log = logging.getLogger("prohost.runner")
#: A run's progress (accepted, started, finished). The status panel reports the
#: same changes, so with a panel attached this logger is turned down to warnings.
progress_log = logging.getLogger(lognames.RUNS)

#: Of an unexpected exception's message, this many characters go into the
#: completion's ``error`` (the traceback is in the log).
INTERNAL_ERROR_CHARS = 300


class Slot(Protocol):
    """The run's concurrency slot, as the scheduler hands it (``lanes.scheduler.Slot``):
    the run gives it back itself once its agent has ended; True if that call did.
    Idempotent."""

    def release(self) -> bool: ...


class _NoSlot:
    """``Runner.run`` without a scheduler slot to give back."""

    def release(self) -> bool:
        return False


NO_SLOT: Slot = _NoSlot()


async def _post_timeline(
    batcher: TimelineBatcher, run_id: str, *, task_status: trio.TaskStatus[None]
) -> None:
    """The batcher's task. The timeline is best effort: a failure in it is logged
    and never takes the run (or its report) with it. Cancelled: as ``batcher.run``."""
    try:
        await batcher.run(task_status=task_status)
    except Exception:
        log.exception("run %s: the timeline stopped; the run goes on without it", run_id)


def _paths_of(exc: BaseException) -> list[object]:
    """The paths an exception names, for those no known place covers."""
    return [getattr(exc, "filename", None), getattr(exc, "filename2", None)]


class Runner:
    """Executes and reports runs; shared by every run of one harness.

    Handed its parts by the composition root: how agents start (``setup``), the
    ledger steps, the reporter and the outbox, the account gate, the worktrees
    (``None`` without ``--repos``), the agents' base environment, the folder runs'
    MCP folders go in, and what to tell of a change (``on_change``) and of an
    outcome (``on_outcome``).
    """

    def __init__(
        self,
        *,
        steps: RunSteps,
        outbox: Outbox,
        workspaces: Workspaces,
        attempts: Attempts,
        on_change: Callable[[], None],
        on_outcome: Callable[[str, str, Progress, Outcome], None],
        bodies: QueuedBodies | None = None,
    ) -> None:
        self.steps = steps
        #: Reports that outlived their retry window, tried again (§7); its reporter
        #: posts every report.
        self.outbox = outbox
        #: What each run's workspace is made from (checkouts, folders, confinement).
        self.workspaces = workspaces
        #: Each run's account and attempts (§12).
        self.attempts = attempts
        self._on_change = on_change
        self._on_outcome = on_outcome
        #: Where a queued run's body waits until the run leaves the queue.
        self.bodies = bodies if bodies is not None else QueuedBodies()

    @property
    def setup(self) -> AgentSetup:
        """How agents start: the brain, the command line, the process groups."""
        return self.attempts.setup

    @property
    def reporter(self) -> Reporter:
        """Posts the runs' reports (§7)."""
        return self.outbox.reporter

    async def run(self, held: HeldRun, slot: Slot = NO_SLOT) -> None:
        """Execute ``held`` and settle its report.

        Whatever goes wrong inside (a ledger read, a worktree, the spawn, a brain's
        parser), the run is reported: an exception other than cancellation becomes
        the outcome ``internal error: <type>: <message>`` (retryable), logged with
        its traceback. The ``slot`` is released once the agent has ended and the
        outcome is durable (``finished``), before the report: the slot is for the
        agent, the lane is held until the report settles (§4).

        Cancelling ``held.exec_scope`` stops the agent and reports
        ``held.stop_outcome``; cancelling ``held.life_scope`` (with ``held.dropped``)
        stops everything and records the run as dropped. Cancelled from outside,
        the agent is stopped and the ledger keeps the run where it was, for the next
        start to pick up; the slot is released either way.

        A queued run's body is loaded first (:class:`QueuedBodies`); one that cannot
        be read back is reported as a retryable internal error instead of run.
        """
        problem = await self.bodies.load(held, self.steps.read_body)
        if problem is not None:
            self._release(slot)
            # An OSError reading the ledger names its file: §7, no local path.
            said = without_local_paths(problem, self.workspaces.places())
            await self.settle_only(held, Outcome.failure(internal_error(said),
                                                         retryable=True), recorded=False)
            return
        run = held.run
        try:
            with held.life_scope:
                batcher = None
                if run.timeline_path is not None and self.setup.brain.streams:
                    batcher = TimelineBatcher(self.reporter, run.run_id, run.timeline_path)
                async with trio.open_nursery() as nursery:
                    if batcher is not None:
                        await nursery.start(_post_timeline, batcher, run.run_id)
                    outcome, turn = await self.outcome_of(held, batcher)
                    await self._finish(held, outcome, turn)
                    # The agent has ended and its outcome is in the outbox: another
                    # lane may have the slot while this one is reported.
                    self._release(slot)
                    if batcher is not None:
                        # Every tool row is posted before the completion (§8).
                        await batcher.close()
                    nursery.cancel_scope.cancel()
                await self._report(held, outcome)
        finally:
            self._release(slot)
        if held.dropped:
            await self.record_dropped(held)

    def _release(self, slot: Slot) -> None:
        """Give the run's slot back (idempotent); those waiting on the scheduler's
        figures look again."""
        if slot.release():
            self._on_change()

    async def settle_only(self, held: HeldRun, outcome: Outcome, *, recorded: bool,
                          finished_at: float | None = None) -> None:
        """Report a run that will not (or did not, in this process) execute, once its
        lane is its own (the scheduler starts it then, without a slot): no later
        turn of the conversation touches its checkouts or reports before it (§4).

        ``recorded``: the outcome is already in the ledger (a restart's outbox),
        since ``finished_at`` (epoch s; a 7-day-old one is dropped, not posted). A
        queued run's body is loaded first: the report needs its completion path,
        which a stand-in carries if the body cannot be read back. A run a restart
        found interrupted is reported with what it changed since it began.
        Cancellation as for :meth:`run`.
        """
        await self.bodies.load(held, self.steps.read_body)
        with held.life_scope:
            if held.interrupted is not None and not recorded:
                outcome = await since_restart(held.run_id, outcome, held.interrupted,
                                              self.workspaces.checkouts())
            if not recorded:
                await self._finish(held, outcome)
            else:
                self._on_outcome(held.run_id, held.lane, held.progress, outcome)
                held.move_to(Phase.REPORTING, self._on_change)
            await self._report(held, outcome, finished_at)
        if held.dropped:
            await self.record_dropped(held)

    async def record_dropped(self, held: HeldRun) -> None:
        """Close the run in the ledger without a report (it is closed on the server).
        Shielded and bounded, like every ledger step."""
        # Not durable: lost only with the machine, and then the next start reports
        # it again, which the server answers 404 (§7).
        await self.steps.reported(held.run_id, "dropped: closed on the server")

    async def outcome_of(self, held: HeldRun, timeline: ToolEventSink | None = None
                         ) -> tuple[Outcome, LaneTurn | None]:
        """The run's middle: its account, ``started``, its checkouts and attempts
        (their tool calls to ``timeline``), up to the outcome to report, and the
        lane's turn to save with it (``None``: leave the lane's session as it is).
        Never raises but for cancellation (see :meth:`run`); the ``finished`` step
        and the report are the caller's.

        Cancelled: as :meth:`_start`; the lane's session is not touched.
        """
        tally = Tally()
        try:
            ending = await self._execute(held, timeline, tally)
        except Exception as exc:
            progress = held.progress
            ending = Ending(self._internal_error(held, exc), ran=progress.attempts > 0,
                             session_id=progress.session_id, account=progress.account,
                             totals=tally.totals, confined=self._confined(progress.attempts))
        return ending.outcome(), ending.lane_turn(held.lane)

    def _confined(self, spawns: int) -> bool | None:
        """The completion's ``confined`` (§7) after ``spawns`` spawns of the agent."""
        if not spawns:
            return None
        return self.workspaces.sandbox.complete

    def _internal_error(self, held: HeldRun, exc: BaseException) -> Outcome:
        """An exception no step expected, as the outcome the server hears (§7): the
        run is retryable, since the fault is ours and not the request's."""
        # A nursery's group of one is that one exception.
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]
        if isinstance(exc, StepNotWritten):
            # A full or failing disk refused a step that is never skipped (§7):
            # expected, and said in one line; a traceback is for the unexpected.
            log.error("run %s stopped: %s; reporting it as an internal error",
                      held.run_id, exc)
        else:
            log.error("run %s failed inside the harness; reporting it as an internal "
                      "error", held.run_id, exc_info=exc)
        message = str(exc)
        for secret in self.setup.spec.secrets:
            if secret:
                message = message.replace(secret, "<secret>")
        # §7: no local path in any text sent to the server; scrubbed before the
        # line is cut, so that no path is left cut in half.
        message = one_line(without_local_paths(message, self.workspaces.places(),
                                               _paths_of(exc)),
                           INTERNAL_ERROR_CHARS)
        error = internal_error(f"{type(exc).__name__}: {message}" if message
                               else type(exc).__name__)
        return Outcome.failure(error, retryable=True)

    async def _execute(self, held: HeldRun, timeline: ToolEventSink | None,
                       tally: Tally) -> Ending:
        """The run's account, then its attempts (:meth:`_begin`); a stop's outcome
        when ``held.exec_scope`` was cancelled meanwhile.

        Cancelled from outside: as :meth:`_begin`.
        """
        run = held.run
        ending: Ending | None = None
        with held.exec_scope:
            chosen = await self.attempts.account_for(held)
            if isinstance(chosen, Outcome):
                ending = Ending(chosen)
            else:
                ending = await self._begin(held, timeline, chosen, tally)
        if ending is None:  # the exec scope was cancelled: a cancel or a stop
            if held.stop_outcome is None:
                raise RuntimeError(f"harness bug: run {run.run_id} was stopped without "
                                   "an outcome to report")
            return await self._stopped(held, held.stop_outcome, tally)
        return ending

    async def _stopped(self, held: HeldRun, said: Outcome, tally: Tally) -> Ending:
        """The ending of a run whose agent a cancel or a stop ended: like every other
        (§7), with what the run changed, how long it ran and what it spent; a spend
        the CLI never said (a stopped turn that printed no totals, whose totals
        cannot be read where the CLI records them) is flagged
        ``includes_earlier_turns`` on the lane's next turn (the brain's meter,
        :meth:`prohost.engine.agent.meter.UsageMeter.unreported`).

        Cancelled (the stop's deadline): the changes are not read, nothing else
        waits."""
        progress = held.progress
        usage = tally.spent
        if tally.totals is None and progress.session_id is not None and progress.attempts:
            # The stopped turn printed no totals (§7): as for a failed one.
            share = await self.attempts.meter.unreported(held.run_id, progress.session_id,
                                                        tally)
            if share is not None:
                usage = usage + share
        duration_ms = changes = None
        if tally.began is not None:
            duration_ms = round((trio.current_time() - tally.began) * 1000)
            if tally.changes is not None:
                # Within a stop's window (the second signal's 5 s), a second is kept
                # for `finished` and the report: changes cut short are left out.
                with trio.move_on_at(trio.current_effective_deadline() - 1.0):
                    try:
                        changes = await tally.changes()
                    except Exception:  # the report goes on without them: logged
                        log.exception("run %s: could not read what it changed",
                                      held.run_id)
        return Ending(said, ran=progress.attempts > 0,
                      session_id=progress.session_id, account=progress.account,
                      totals=tally.totals, usage=usage if tally.began is not None else None,
                      duration_ms=duration_ms, changes=changes,
                      confined=self._confined(progress.attempts))

    async def _begin(self, held: HeldRun, timeline: ToolEventSink | None,
                     account: Account, tally: Tally) -> Ending:
        """``started``, then the run's workspace (:class:`Workspaces`), then its
        attempts on ``account`` and the accounts after it (:class:`Attempts`), all
        inside the run's deadline.

        Raises when ``started`` or the agent's process group cannot be written
        (never spawning the agent, or killing its group): :meth:`outcome_of` turns
        that into a retryable internal error. Cancelled: the running agent's group
        is stopped (shielded, bounded) and the run's scratch folder removed before
        the cancellation propagates.
        """
        run, workspaces = held.run, self.workspaces
        held.move_to(Phase.PREPARING, self._on_change)
        session = await self.steps.started(run.run_id, run.lane, account.name)
        self.attempts.started(account)
        # Still "preparing" while its private checkouts are made (§5.1): heartbeats
        # and the panel show why a run has no agent yet.
        held.started_at = time.time()
        held.move_to(Phase.PREPARING if workspaces.has_checkouts else Phase.RUNNING,
                     self._on_change)
        if progress_log.isEnabledFor(logging.INFO):  # its parts are made only to be shown
            named = ("" if len(self.attempts.book.accounts) == 1
                     else f" on account {account.name}")
            progress_log.info("▶ run %s started on %s%s%s", run.run_id, run.lane, named,
                              f" (resuming session {session})" if session else "")
        # The budget starts now, not at spawn: preparing the run is part of it.
        began = tally.began = trio.current_time()
        timeout_s = self.setup.spec.timeout_s
        deadline = began + timeout_s if timeout_s > 0 else math.inf
        workspace = workspaces.workspace(run)
        tally.changes = workspace.checkouts.changes  # a cancel or a stop reads them too
        failed = await workspace.prepare(held.progress, deadline, tally.ended,
                                         on_ready=lambda: held.move_to(Phase.RUNNING,
                                                                       self._on_change))
        if failed is not None:
            return failed
        try:
            return await self.attempts.run(held, workspace, account, session, tally,
                                           timeline, deadline, tally.ended)
        finally:
            await workspace.close()

    async def _finish(self, held: HeldRun, outcome: Outcome,
                      turn: LaneTurn | None = None) -> None:
        """Books, logs and the ``finished`` step (the outcome is now in the outbox),
        with the lane's ``turn`` saved first, in the same hand-off.

        ``finished`` is never skipped (§7): while the disk refuses it, the run waits
        and tries again (:meth:`LedgerSteps.finished`), and only then is the
        outcome posted. Posting it first would leave the row ``started``, and a
        restart would report the run a second time, as "restarted".

        Cancelled: as :meth:`LedgerSteps.finished`; the outcome is not posted, and
        the next start reports the run where the ledger has it.
        """
        self._on_outcome(held.run_id, held.lane, held.progress, outcome)
        held.move_to(Phase.REPORTING, self._on_change)
        await self.steps.finished(held.run_id, outcome.to_json(), turn)

    async def _report(self, held: HeldRun, outcome: Outcome,
                      finished_at: float | None = None) -> None:
        """Post the outcome and record how that went (``reported``).

        ``finished_at``: when the outcome was recorded (epoch s), if not just now.
        A report the retry window could not settle is handed to the outbox (§7):
        this returns, so the run lets its lane go, and the outcome stays
        ``finished`` in the ledger, tried again every 5 minutes, on each reconnect
        and at each start, for up to 7 days after ``finished_at``.

        Never raises but for cancellation (then nothing more is recorded, and the
        ledger's saved outcome is still the outbox). If posting fails unexpectedly,
        the run stays ``finished`` so that the next start posts it again.
        """
        run = held.run
        outbox = self.outbox
        if finished_at is None:
            finished_at = outbox.timing.clock()
        elif outbox.expired(finished_at):
            await outbox.drop_expired(run.run_id, finished_at)
            return
        try:
            settlement = await self.reporter.complete(
                run.run_id, run.completion_path, outcome.completion(run.run_id)
            )
        except Exception:
            log.exception("run %s could not be reported; it stays in the ledger's outbox "
                          "and is reported at the next start", run.run_id)
            return
        if settlement.kind == "gave_up":
            log.warning("run %s: its report did not settle within %.0f s; the "
                        "conversation's next turn may start, and the outcome waits in the "
                        "ledger's outbox, posted again every %.0f s and on each reconnect",
                        run.run_id, outbox.timing.window_s, outbox.timing.retry_every_s)
            outbox.add(run.run_id, run.completion_path, finished_at)
            return
        # The reporter already said how a normal settlement went.
        level = logging.DEBUG if settlement.kind in ("delivered", "already") else logging.WARNING
        log.log(level, "reported run %s: %s", run.run_id, settlement.detail)
        await outbox.record(run.run_id, settlement)
