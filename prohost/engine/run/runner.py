"""One run from dispatch to settled report, in its own cancel scopes (PROTOCOL.md §5–§7).

The supervisor (:mod:`prohost.engine.harness`) decides *which* run goes and keeps the
books; this module does one run's steps, each written to the ledger before the
next begins::

    started → (worktrees, prompt, agent: prohost.engine.run.execute) → finished → POST → reported

``started``, the agent's process group and ``finished`` wait for their fsync (a
``started`` or process group that cannot be written stops the run: §7); the lane's
session and ``reported`` are written with ``durable=False`` and ride the next commit
(why each may, in :mod:`prohost.engine.ledger`).

The ledger steps themselves, bounded and with as few worker-thread hops as they
can, are :mod:`prohost.engine.ledger.steps`'s.

A :class:`~prohost.engine.run.heldrun.HeldRun` carries two cancel scopes. ``exec_scope``
stops the agent and the run is still reported (a ``cancel``, the second signal) with
its ``stop_outcome``; ``life_scope`` stops everything, the report included (the
server said it no longer knows the run). Ledger steps are shielded and bounded, so a
cancel never leaves one half done. Which account a run starts on, and the wait while
every account is limited (§12), are :mod:`prohost.engine.accounts.gate`'s.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import attrs
import trio

from prohost.engine import lognames
from prohost.engine.accounts.book import Account, AccountBook
from prohost.engine.accounts.gate import AccountGate
from prohost.engine.agent.brains import Brain
from prohost.engine.agent.brains.base import one_line
from prohost.engine.agent.environment import scratch_folder
from prohost.engine.agent.process import ProcessGroups
from prohost.engine.ledger import LedgerError
from prohost.engine.ledger.steps import LedgerSteps, StepNotWritten, Turn
from prohost.engine.report.outbox import Outbox, ReportTiming
from prohost.engine.report.reporter import Reporter
from prohost.engine.report.timeline import TimelineBatcher
from prohost.engine.repos.worktrees import WorktreeManager
from prohost.engine.run.execute import AccountPlan, ExecSpec, execute
from prohost.engine.run.heldrun import HeldRun
from prohost.engine.run.queued_bodies import QueuedBodies
from prohost.wire.outcomes import internal_error
from prohost.wire.runs import Outcome
from prohost.wire.usage import Usage

log = logging.getLogger("prohost.runner")
#: A run's progress (accepted, started, finished). The status panel reports the
#: same changes, so with a panel attached this logger is turned down to warnings.
progress_log = logging.getLogger(lognames.RUNS)

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


class Runner:
    """Executes and reports runs; shared by every run of one harness."""

    def __init__(
        self,
        *,
        spec: ExecSpec,
        brain: Brain,
        steps: LedgerSteps,
        reporter: Reporter,
        groups: ProcessGroups,
        env: Mapping[str, str],
        worktrees: WorktreeManager | None,
        scratch_root: Path,
        on_change: Callable[[], None],
        on_outcome: Callable[[HeldRun, Outcome], None],
        book: AccountBook | None = None,
        limit_wait_s: float = 0.0,
        clock: Callable[[], float] = time.time,
        bodies: QueuedBodies | None = None,
        timing: ReportTiming | None = None,
    ) -> None:
        self.spec = spec
        self.brain = brain
        self.ledger = steps.ledger
        self.reporter = reporter
        self.groups = groups
        self.env = env
        self.worktrees = worktrees
        self.scratch_root = scratch_root
        self._on_change = on_change
        self._on_outcome = on_outcome
        #: The harness's ledger steps, bounded (engine/ledger/steps.py).
        self.steps = steps
        #: Reports that outlived their retry window, tried again (§7).
        self.outbox = Outbox(reporter, self.steps, timing=timing, on_change=on_change)
        #: Where a queued run's body waits until the run leaves the queue.
        self.bodies = bodies if bodies is not None else QueuedBodies()
        #: The agent accounts and their limits (PROTOCOL.md §12).
        self.book = book if book is not None else AccountBook()
        #: Wall-clock epoch seconds, for the book's reset times.
        self.clock = clock
        #: Which account each run starts on, and the wait while none can.
        self.accounts = AccountGate(
            self.book, limit_wait_s=limit_wait_s, clock=clock, on_change=on_change,
            save_limits=functools.partial(self.steps.step, self.ledger.save_account_limits),
        )

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

        A queued run's body is loaded first (:class:`QueuedBodies`); one that cannot
        be read back is reported as a retryable internal error instead of run.
        """
        problem = await self.bodies.load(held, self.steps.read_body)
        if problem is not None:
            release_slot()
            await self.settle_only(held, Outcome.failure(internal_error(problem),
                                                         retryable=True), recorded=False)
            return
        run = held.run
        try:
            with held.life_scope:
                batcher = None
                if run.timeline_path is not None and self.brain.streams:
                    batcher = TimelineBatcher(self.reporter, run.run_id, run.timeline_path)
                async with trio.open_nursery() as nursery:
                    if batcher is not None:
                        await nursery.start(_post_timeline, batcher, run.run_id)
                    outcome, turn = await self._outcome_of(held, batcher)
                    await self._finish(held, outcome, turn)
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

    async def settle_only(self, held: HeldRun, outcome: Outcome, *, recorded: bool,
                          finished_at: float | None = None,
                          lane_turn: Callable[[], Awaitable[None]] | None = None) -> None:
        """Report a run that will not (or did not, in this process) execute.

        ``recorded``: the outcome is already in the ledger (a restart's outbox),
        since ``finished_at`` (epoch s; a 7-day-old one is dropped, not posted).
        ``lane_turn`` returns once the run's lane is its own: the outcome is
        recorded at once, the report waits for the conversation's earlier turns
        (§4). A queued run's body is loaded first: the report needs its completion
        path, which a stand-in carries if the body cannot be read back.
        Cancellation as for :meth:`run`.
        """
        await self.bodies.load(held, self.steps.read_body)
        with held.life_scope:
            if not recorded:
                await self._finish(held, outcome)
            else:
                held.state = "reporting"
                self._on_outcome(held, outcome)
            if lane_turn is not None:
                await lane_turn()
            await self._report(held, outcome, finished_at)
        if held.dropped:
            await self.record_dropped(held)

    async def record_dropped(self, held: HeldRun) -> None:
        """Close the run in the ledger without a report (it is closed on the server).
        Shielded and bounded, like every ledger step."""
        # Not durable: lost only with the machine, and then the next start reports
        # it again, which the server answers 404 (§7).
        await self.steps.soon(self.ledger.mark_reported, held.run_id,
                              "dropped: closed on the server", time.time())

    async def _outcome_of(
        self, held: HeldRun, batcher: TimelineBatcher | None
    ) -> tuple[Outcome, Turn | None]:
        """The run's outcome, and the lane's turn to save with its ``finished`` step
        (``None``: leave the lane's session as it is); never raises but for
        cancellation (see :meth:`run`).

        Cancelled: as :meth:`_execute`; the lane's session is not touched.
        """
        try:
            outcome = await self._execute(held, batcher)
        except Exception as exc:
            outcome = self._internal_error(held, exc)
        if not held.progress.attempts:
            # A run whose agent never started leaves the lane's session as it was:
            # nothing happened to it.
            return outcome, None
        outcome = attrs.evolve(outcome, account=held.progress.account)
        totals = held.progress.session_totals
        # The lane's next turn resumes whatever session this one ended with, failed
        # or not; a rejected session that was replaced is forgotten here too.
        return outcome, (held.lane, held.progress.account, outcome.session_id,
                         None if totals is None else json.dumps(totals.to_json()))

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
        message = one_line(str(exc), INTERNAL_ERROR_CHARS)
        for secret in self.spec.secrets:
            if secret:
                message = message.replace(secret, "<secret>")
        error = internal_error(f"{type(exc).__name__}: {message}" if message
                               else type(exc).__name__)
        return Outcome.failure(error, retryable=True, session_id=held.progress.session_id)

    async def _execute(self, held: HeldRun, batcher: TimelineBatcher | None) -> Outcome:
        run = held.run
        ledger = self.ledger
        outcome: Outcome | None = None
        with held.exec_scope:
            lane_account = None
            if len(self.book.accounts) > 1:
                # A read under the ledger's lock: abandoning it on a hung disk is safe.
                lane_account = await self.steps.bounded(ledger.lane_account, run.lane,
                                                        what="reading the lane's account")
            chosen = await self.accounts.wait_for_account(held.run_id, held.progress,
                                                          lane_account)
            if isinstance(chosen, Outcome):
                outcome = chosen
            else:
                outcome = await self._start(held, batcher, chosen)
        if outcome is None:  # the exec scope was cancelled: a cancel or a stop
            if held.stop_outcome is None:
                raise RuntimeError(f"harness bug: run {run.run_id} was stopped without "
                                   "an outcome to report")
            outcome = attrs.evolve(held.stop_outcome, session_id=held.progress.session_id)
        return outcome

    async def _start(self, held: HeldRun, batcher: TimelineBatcher | None,
                     account: Account) -> Outcome:
        """``started``, then the agent on ``account`` (and others, failing over).

        Raises when ``started`` or the agent's process group cannot be written
        (never spawning the agent, or killing its group): :meth:`_outcome_of` turns
        that into a retryable internal error. Cancelled: as
        :func:`prohost.engine.run.execute.execute`.
        """
        run = held.run
        ledger = self.ledger
        held.state = "preparing"
        session = await self.steps.started_then_session(run.run_id, run.lane, account.name)
        self.book.started(account.name, self.clock())
        held.progress.account = account.name
        # Still "preparing" while its private checkouts are made (§5.1): heartbeats
        # and the panel show why a run has no agent yet.
        preparing = self.worktrees is not None and self.worktrees.enabled
        held.state = "preparing" if preparing else "running"
        held.started_at = time.time()
        self._on_change()

        def prepared() -> None:
            if held.state != "running":
                held.state = "running"
                self._on_change()
        if progress_log.isEnabledFor(logging.INFO):  # its parts are made only to be shown
            named = "" if len(self.book.accounts) == 1 else f" on account {account.name}"
            progress_log.info("▶ run %s started on %s%s%s", run.run_id, run.lane, named,
                              f" (resuming session {session})" if session else "")

        async def spawned(pgid: int) -> None:
            # Durable, and waited for before the agent's output is: a restart
            # after a kill -9 finds and kills this group only if it was written
            # (§7). Raising here (the write failed or outlived its bound) makes
            # run_agent kill the group, and the run is reported as an internal
            # error: a step that cannot be written is never skipped.
            await self.steps.record_pgid(run.run_id, pgid)

        async def another(tried: frozenset[str],
                          deadline: float) -> tuple[Account, str | None] | None:
            following = self.book.choose(self.clock(), exclude=tried)
            if following is None and self.book.all_limited(self.clock()):
                # No other account can take it now: wait like a queued run (§12),
                # within the run's --timeout as well as --limit-wait.
                with trio.move_on_at(deadline):
                    waited = await self.accounts.wait_for_account(held.run_id, held.progress,
                                                                  None)
                    following = waited if isinstance(waited, Account) else None
            if following is None:
                return None
            there = await self.steps.bounded(
                ledger.account_session, run.lane, following.name,
                what="reading the lane's session from the ledger")
            self.book.started(following.name, self.clock())
            self._on_change()
            return following, there

        async def totals_of(session_id: str) -> Usage:
            # What the resumed session had reached (§7: Codex reports running
            # totals). Unreadable: the run goes on, its figures then the totals'.
            try:
                text = await self.steps.bounded(ledger.session_totals, session_id,
                                                what="reading the session's usage")
                return Usage.from_json(json.loads(text)) if text else Usage()
            except (LedgerError, OSError, ValueError) as exc:
                log.warning("run %s: could not read session %s's usage so far: %s",
                            run.run_id, session_id, exc)
                return Usage()

        return await execute(
            run, self.spec, self.brain,
            usage_before=totals_of if self.brain.running_totals else None,
            groups=self.groups,
            session_id=session,
            progress=held.progress,
            on_spawn=spawned,
            on_events=batcher.add if batcher is not None else None,
            base_env=self.env,
            # Named by a digest of the run id, never the id itself (§3).
            scratch=scratch_folder(self.scratch_root, run.run_id),
            worktrees=self.worktrees,
            bounds=self.steps.bounds,
            on_prepared=prepared,
            accounts=AccountPlan(account=account, learned=self.accounts.learned,
                                 another=another),
        )

    async def _finish(self, held: HeldRun, outcome: Outcome, turn: Turn | None = None) -> None:
        """Books, logs and the ``finished`` step (the outcome is now in the outbox),
        with the lane's ``turn`` saved first, in the same worker thread.

        ``finished`` is never skipped (§7): while the disk refuses it, the run waits
        and tries again (:meth:`LedgerSteps.until_written`), and only then is the
        outcome posted. Posting it first would leave the row ``started``, and a
        restart would report the run a second time, as "restarted".

        Cancelled: as :meth:`LedgerSteps.until_written`; the outcome is not posted,
        and the next start reports the run where the ledger has it.
        """
        run = held.run
        held.state = "reporting"
        self._on_outcome(held, outcome)
        await self.steps.until_written(self.steps.save_turn_and_finish, run.run_id,
                                       outcome.to_json(), time.time(), turn,
                                       what="the ledger step mark_finished")

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
