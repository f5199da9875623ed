"""One run from dispatch to settled report, in its own cancel scopes (PROTOCOL.md §5–§7).

The supervisor (:mod:`prohost.engine.harness`) decides *which* run goes and keeps the
books; this module does one run's steps, each written to the ledger before the
next begins::

    started → (worktrees, prompt, agent: prohost.engine.execute) → finished → POST → reported

``started`` and ``finished`` wait for their fsync; the agent's process group, the
lane's session and ``reported`` are written with ``durable=False`` and ride the next
commit (why each may, in :mod:`prohost.engine.ledger`).

Each worker-thread hop costs the harness's one trio thread about 0.15 ms of CPU, so
a run makes as few as it can: the lane's session is read in the same hop as
``started``, and saved in the same hop as ``finished``; and the process
group and ``reported`` are queued from the trio thread, without a hop, whenever the
ledger's writer is at work (about a third of the time with 16 busy runs on a fast disk).

A :class:`HeldRun` carries two cancel scopes. ``exec_scope`` stops the agent and
the run is still reported (a ``cancel``, the second signal) with its
``stop_outcome``; ``life_scope`` stops everything, the report included (the server
said it no longer knows the run). Ledger steps are shielded and bounded, so a
cancel never leaves one half done. Which account a run starts on, and the wait
while every account is limited (§12), are :mod:`prohost.engine.accountgate`'s.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs
import trio

from prohost.engine.accountgate import AccountGate, waiting_activity

# Re-exported: prohost.engine.harness and prohost.engine.recovery import these two
# from here (their home is prohost.engine.accountgate).
from prohost.engine.accounts import Account, AccountBook
from prohost.engine.agentenv import scratch_folder
from prohost.engine.agentproc import ProcessGroups
from prohost.engine.blocking import Bounds, StepTimedOut
from prohost.engine.brains import Brain
from prohost.engine.brains.base import one_line
from prohost.engine.execute import AccountPlan, ExecSpec, Progress, execute
from prohost.engine.ledger import Ledger, LedgerError
from prohost.engine.reporter import Reporter
from prohost.engine.timeline import TimelineBatcher
from prohost.engine.worktrees import WorktreeManager
from prohost.wire.protocol import RunBeat
from prohost.wire.runs import CONVERSATION_LANE, AgentRun, Outcome

log = logging.getLogger("prohost.runner")
#: A run's progress (accepted, started, finished). The status panel reports the
#: same changes, so with a panel attached this logger is turned down to warnings.
progress_log = logging.getLogger("prohost.harness.runs")

#: Bound on one ledger step (s). A step is a local fsync; if it takes longer, the
#: disk is in trouble, and the step is abandoned (prohost.engine.blocking).
LEDGER_STEP_TIMEOUT_S = 30.0
#: Of an unexpected exception's message, this many characters go into the
#: completion's ``error`` (the traceback is in the log).
INTERNAL_ERROR_CHARS = 300


#: A lane's turn to save with its run's ``finished`` step: lane, account, and the
#: session the turn ended with (``None`` forgets the lane's session).
_Turn = tuple[str, str, str | None]


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
    """A run from accept until its report settles; what heartbeats list.

    A queued run is kept light: its id, lane and state, and at most the text its
    body was delivered in (:attr:`raw`). The body is parsed when the run leaves the
    queue, and its cancel scopes and :class:`Progress` are made when first used, so
    that 10,000 queued runs do not hold 10,000 parsed bodies (most of the harness's
    memory).
    """

    run_id: str
    lane: str
    #: The parsed body, once the run leaves the queue (:func:`prohost.engine.recovery.load_body`);
    #: ``None`` while it waits. Read it as :attr:`run`.
    body: AgentRun | None = None
    #: While queued: the body's text as delivered, if the queued runs' texts fit the
    #: harness's budget (``Harness.queued_text_budget``); else ``None``, and the body
    #: is read back from the ledger (which has had it since before the ack).
    raw: str | None = None
    state: str = "queued"  # queued | preparing | running | reporting
    started_at: float | None = None
    stop_outcome: Outcome | None = None
    dropped: bool = False
    #: Where the run's report goes, kept while the body is not: a run whose body
    #: cannot be read back is still reported (``prohost.engine.recovery.load_body``).
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

    @property
    def conversation_id(self) -> str | None:
        """The conversation of the run's lane (§4), without its body."""
        return self.lane[len(CONVERSATION_LANE):] \
            if self.lane.startswith(CONVERSATION_LANE) else None

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
        return progress.activity if self.state == "running" else None

    def beat(self) -> RunBeat:
        """This run's heartbeat entry; a queued run's is only its id and state (§2),
        so that 10,000 queued runs still make a heartbeat far below 4 MiB (one
        waiting for an account's limit to reset also says so, §12)."""
        if self.state == "queued":
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
        book: AccountBook | None = None,
        limit_wait_s: float = 0.0,
        clock: Callable[[], float] = time.time,
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
        #: The agent accounts and their limits (PROTOCOL.md §12).
        self.book = book if book is not None else AccountBook()
        #: Wall-clock epoch seconds, for the book's reset times.
        self.clock = clock
        #: Which account each run starts on, and the wait while none can.
        self.accounts = AccountGate(
            self.book, limit_wait_s=limit_wait_s, clock=clock, on_change=on_change,
            save_limits=functools.partial(self._ledger, ledger.save_account_limits),
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
        # Not durable: lost only with the machine, and then the next start reports
        # it again, which the server answers 404 (§7).
        await self._ledger_soon(self.ledger.mark_reported, held.run_id,
                                "dropped: closed on the server", time.time())

    async def _outcome_of(
        self, held: HeldRun, batcher: TimelineBatcher | None
    ) -> tuple[Outcome, _Turn | None]:
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
        # The lane's next turn resumes whatever session this one ended with, failed
        # or not; a rejected session that was replaced is forgotten here too.
        return outcome, (held.lane, held.progress.account, outcome.session_id)

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
        outcome: Outcome | None = None
        with held.exec_scope:
            lane_account = None
            if len(self.book.accounts) > 1:
                # A read under the ledger's lock: abandoning it on a hung disk is safe.
                lane_account = await self.bounds.run(ledger.lane_account, run.lane,
                                                     limit_s=LEDGER_STEP_TIMEOUT_S,
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

        Cancelled: as :func:`prohost.engine.execute.execute`.
        """
        run = held.run
        ledger = self.ledger
        held.state = "preparing"
        session = await self._mark_started(run, account)
        self.book.started(account.name, self.clock())
        held.progress.account = account.name
        held.state = "running"
        held.started_at = time.time()
        self._on_change()
        named = "" if len(self.book.accounts) == 1 else f" on account {account.name}"
        progress_log.info("▶ run %s started on %s%s%s", run.run_id, run.lane, named,
                          f" (resuming session {session})" if session else "")

        async def spawned(pgid: int) -> None:
            # With the group recorded, a restarted harness can find and kill
            # this agent if this process dies while it runs (§7). Not durable:
            # a commit without fsync survives this process dying, and only
            # then can the agent outlive it.
            await self._ledger_soon(ledger.record_pgid, run.run_id, pgid)

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
            there = await self.bounds.run(ledger.account_session, run.lane, following.name,
                                          limit_s=LEDGER_STEP_TIMEOUT_S,
                                          what="reading the lane's session from the ledger")
            self.book.started(following.name, self.clock())
            self._on_change()
            return following, there

        return await execute(
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
            accounts=AccountPlan(account=account, learned=self.accounts.learned,
                                 another=another),
        )

    async def _mark_started(self, run: AgentRun, account: Account) -> str | None:
        """The ``started`` step (durable: before the spawn), then the session the
        lane's last turn on ``account`` ended with, in one worker thread.

        A failed ``started`` is logged and the run goes on, as with :meth:`_ledger`;
        a failed read fails the run (an internal error). Cancelled: as :meth:`_ledger`.
        """
        # Abandoning it on a hung disk is safe: a ledger step (see _ledger) and a
        # read on the ledger's read connection; the run then fails with the StepTimedOut.
        return await self.bounds.run(
            self._started_then_session, run.run_id, time.time(), run.lane, account.name,
            limit_s=LEDGER_STEP_TIMEOUT_S,
            what="the ledger step mark_started, or reading the lane's session")

    def _started_then_session(self, run_id: str, now: float, lane: str,
                              account: str) -> str | None:
        """In a worker thread: ``started``, then the lane's session on ``account``
        (it sees that commit and every one before). One hop for both."""
        try:
            self.ledger.mark_started(run_id, now)
        except LedgerError as exc:
            # A step out of order must not take the run down with it (as _ledger).
            log.error("ledger: %s", exc)
        return self.ledger.account_session(lane, account)

    async def _finish(self, held: HeldRun, outcome: Outcome, turn: _Turn | None = None) -> None:
        """Books, logs and the ``finished`` step (the outcome is now in the outbox),
        with the lane's ``turn`` saved first, in the same worker thread.

        Never raises but for cancellation: a ledger failure is logged and the run
        is reported all the same, since the server hearing it matters most.
        """
        run = held.run
        held.state = "reporting"
        self._on_outcome(held, outcome)
        try:
            await self._ledger(self._save_turn_and_finish, run.run_id, outcome.to_json(),
                               time.time(), turn, what="the ledger step mark_finished")
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
            # Not durable: lost only with the machine, and then the next start posts
            # the saved outcome again, which the server takes as a duplicate (§7).
            await self._ledger_soon(self.ledger.mark_reported, run.run_id,
                                    f"{settlement.kind}: {settlement.detail}", time.time())
        except Exception:
            log.exception("run %s was reported but that could not be recorded; the next "
                          "start reports it again (the server takes it as a duplicate)",
                          run.run_id)

    def _save_turn_and_finish(self, run_id: str, outcome_json: str, now: float,
                              turn: _Turn | None) -> None:
        """In a worker thread: the lane's session (not durable: queued first, it is in
        the ``finished`` commit or an earlier one, so finished ⇒ session kept), then
        ``finished`` (durable). One hop for both."""
        if turn is not None:
            lane, account, session_id = turn
            try:
                self.ledger.save_turn(lane, account, session_id, now, durable=False)
            except Exception:
                log.exception("run %s: could not save the session of %s", run_id, lane)
        self.ledger.mark_finished(run_id, outcome_json, now)

    async def _ledger_soon(self, step: Callable[..., bool], *args: object) -> None:
        """A ledger step written with ``durable=False`` (``record_pgid``,
        ``mark_reported``): queued from the trio thread for the ledger's writer when
        one is at work (no worker thread), else as :meth:`_ledger` does.

        Cancelled: as :meth:`_ledger` (queuing never waits).
        """
        try:
            if step(*args, durable=False, queue_only=True):
                return
        except LedgerError as exc:
            log.error("ledger: %s", exc)
            return
        await self._ledger(step, *args, durable=False)

    async def _ledger(
        self, step: Callable[..., object], *args: object, durable: bool = True,
        what: str | None = None,
    ) -> None:
        """One ledger step, in a worker thread; with ``durable``, once it is fsync'd.
        Without, once it is queued for the next commit (or committed, without an
        fsync, when nothing else was being written).

        Cancelled: not interrupted — a step that was begun is finished even when
        the run is being cancelled, or the ledger would disagree with what was
        done — but bounded: after LEDGER_STEP_TIMEOUT_S, or at the second signal's
        deadline, the step is abandoned and logged, and the run goes on; the next
        start finds the run wherever the ledger has it and reports it (§7).
        """
        if what is None:
            what = f"the ledger step {getattr(step, '__name__', 'step')}"
        try:
            # Abandoning is safe: each ledger write is a whole transaction (or a
            # savepoint of one) that the ledger's writer completes or rolls back
            # on its own (see prohost.engine.ledger and prohost.engine.blocking).
            call = step if durable else functools.partial(step, durable=False)
            await self.bounds.run(call, *args, limit_s=LEDGER_STEP_TIMEOUT_S,
                                  what=what)
        except LedgerError as exc:
            # A step out of order (say, a drop racing a report that just
            # settled) must not take the run's task down with it.
            log.error("ledger: %s", exc)
        except StepTimedOut as exc:
            log.error("ledger: %s", exc)
