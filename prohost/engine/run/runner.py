"""One run from dispatch to settled report, in its own cancel scopes (docs/protocol.md §5–§7).

The supervisor (:mod:`prohost.engine.harness`) decides *which* run goes; the
:class:`Runner` owns the run from then on: its state, its steps in order (each
written to the ledger before the next begins), its account and the fail-over to
another, and the one place its outcome is finished::

    started → checkouts → prompt → attempt (execute) ─┬─ ended by a limit: next account
                                                       └─ else → finished → POST → reported

An attempt (:func:`prohost.engine.run.execute.execute`) is one account and one
session: it is handed a frozen :class:`~prohost.engine.run.execute.Attempt` and
returns an :class:`~prohost.engine.run.execute.AttemptResult`, calling nothing back
but ``on_spawn`` (the process group's durable step, §7).

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

import functools
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

from prohost.engine import lognames
from prohost.engine.accounts.book import Account, AccountBook
from prohost.engine.accounts.gate import AccountGate
from prohost.engine.agent.brains.base import McpError, one_line
from prohost.engine.agent.environment import scratch_folder
from prohost.engine.ledger import LedgerError
from prohost.engine.ledger.steps import LaneTurn, LedgerSteps, StepNotWritten
from prohost.engine.report.outbox import Outbox
from prohost.engine.report.reporter import Reporter
from prohost.engine.report.timeline import TimelineBatcher
from prohost.engine.repos.worktrees import WorktreeManager, lane_folder_name
from prohost.engine.run.checkouts import LaneCheckouts
from prohost.engine.run.confine import (
    SANDBOX_OFF,
    ConfinementFailed,
    RunConfinement,
    RunPlaces,
    Sandbox,
    confine,
    confined_env,
)
from prohost.engine.run.ending import Ending, RecordsTotals, Tally, since_restart
from prohost.engine.run.execute import (
    AgentSetup,
    Attempt,
    AttemptResult,
    ToolEventSink,
    execute,
    left_of,
)
from prohost.engine.run.heldrun import HeldRun, Phase
from prohost.engine.run.queued_bodies import QueuedBodies
from prohost.engine.run.staging import (
    env_for,
    mcp_folder,
    mend_session,
    prompt_for,
    remove_scratch,
    share_login,
    wire_mcp,
    workdir_for,
)
from prohost.execline import acp_agent
from prohost.wire.changes import ChangeEntry
from prohost.wire.outcomes import (
    NOT_CONFINED,
    budget_reached,
    internal_error,
    limit_phrase,
    without_local_paths,
)
from prohost.wire.runs import AgentRun, Outcome
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
        setup: AgentSetup,
        steps: LedgerSteps,
        reporter: Reporter,
        outbox: Outbox,
        gate: AccountGate,
        env: Mapping[str, str],
        worktrees: WorktreeManager | None,
        scratch_root: Path,
        on_change: Callable[[], None],
        on_outcome: Callable[[HeldRun, Outcome], None],
        clock: Callable[[], float] = time.time,
        bodies: QueuedBodies | None = None,
        sandbox: Sandbox = SANDBOX_OFF,
    ) -> None:
        self.setup = setup
        #: How agents are confined (§13): its ``confines`` alone says whether they are.
        self.sandbox = sandbox
        #: Whose own folders a confined run is granted: the brain's, or for the ACP
        #: brain the agent its command line starts (each has folders of its own).
        self._agent = setup.brain.name
        if setup.brain.name == "acp":
            self._agent = acp_agent(setup.spec.command) or "acp"
        self.steps = steps
        self.reporter = reporter
        #: Reports that outlived their retry window, tried again (§7).
        self.outbox = outbox
        #: Which account each run starts on, and the wait while none can (§12).
        self.gate = gate
        self.env = env
        self.worktrees = worktrees if worktrees is not None and worktrees.enabled else None
        self.scratch_root = scratch_root
        self._on_change = on_change
        self._on_outcome = on_outcome
        #: Wall-clock epoch seconds, for the book's reset times.
        self.clock = clock
        #: Where a queued run's body waits until the run leaves the queue.
        self.bodies = bodies if bodies is not None else QueuedBodies()

    @property
    def book(self) -> AccountBook:
        """The agent accounts and their limits (docs/protocol.md §12), the gate's."""
        return self.gate.book

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
            # An OSError reading the ledger names its file: §7, no local path.
            said = without_local_paths(problem, self._places())
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

    def will_settle(self, held: HeldRun) -> None:
        """``held`` will be reported without executing (cancelled while queued,
        drained, recovered after a restart): it is ``reporting`` from now on, so
        neither a cancel nor a stop reaches for an agent it will never have."""
        held.move_to(Phase.REPORTING, self._on_change)

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
            if held.interrupted is not None and not recorded:
                # Its checkouts are read once the lane is its own (no later turn
                # touches them meanwhile), then it is finished as any other.
                if lane_turn is not None:
                    await lane_turn()
                    lane_turn = None
                outcome = await since_restart(held.run_id, outcome, held.interrupted,
                                              self._checkouts())
            if not recorded:
                await self._finish(held, outcome)
            else:
                self._on_outcome(held, outcome)
                held.move_to(Phase.REPORTING, self._on_change)
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
        return self.sandbox.complete

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
        message = one_line(without_local_paths(message, self._places(), _paths_of(exc)),
                           INTERNAL_ERROR_CHARS)
        error = internal_error(f"{type(exc).__name__}: {message}" if message
                               else type(exc).__name__)
        return Outcome.failure(error, retryable=True)

    def _places(self) -> list[tuple[Path, str]]:
        """The local folders an internal error's text may name, each with the words
        the server reads instead (:func:`without_local_paths`)."""
        # The scratch root is $PROHOST_HOME/runs (the composition root's), so its
        # parent is the home, which holds the ledger and the worktrees too.
        places = [(self.scratch_root.parent, "$PROHOST_HOME"),
                  (self.setup.spec.workdir, "<workdir>")]
        if self.worktrees is not None:
            # The person's repositories, by their names in the report (§7 ``repo``).
            places += zip(self.worktrees.repos, self.worktrees.names, strict=True)
        return places

    async def _execute(self, held: HeldRun, timeline: ToolEventSink | None,
                       tally: Tally) -> Ending:
        """The run's account, then its attempts (:meth:`_start`); a stop's outcome
        when ``held.exec_scope`` was cancelled meanwhile.

        Cancelled from outside: as :meth:`_start`.
        """
        run = held.run
        ending: Ending | None = None
        with held.exec_scope:
            lane_account = None
            if len(self.book.accounts) > 1:
                # A read under the ledger's lock: abandoning it on a hung disk is safe.
                lane_account = await self.steps.lane_account(run.lane)
            chosen = await self.gate.wait_for_account(held.run_id, held.progress,
                                                      lane_account)
            if isinstance(chosen, Outcome):
                ending = Ending(chosen)
            else:
                ending = await self._start(held, timeline, chosen, tally)
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
        ``includes_earlier_turns`` on the lane's next turn (:meth:`_unreported`).

        Cancelled (the stop's deadline): the changes are not read, nothing else
        waits."""
        progress = held.progress
        usage = tally.spent
        if tally.totals is None and progress.session_id is not None and progress.attempts:
            # The stopped turn printed no totals (§7): as for a failed one.
            share = await self._unreported(held.run_id, progress.session_id, tally)
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
    async def _start(self, held: HeldRun, timeline: ToolEventSink | None,
                     account: Account, tally: Tally) -> Ending:
        """:meth:`_begin` (each attempt makes its own confinement). Cancelled: as
        :meth:`_begin`."""
        return await self._begin(held, timeline, account, tally)

    async def _begin(self, held: HeldRun, timeline: ToolEventSink | None,
                     account: Account, tally: Tally) -> Ending:
        """``started``, then the run's checkouts, prompt and working folder, then its
        attempts on ``account`` and, while each ends at its account's usage limit,
        on the next account the book offers (fresh session there; none left: wait
        as a queued run would, within ``--timeout``), all inside the run's deadline.

        Raises when ``started`` or the agent's process group cannot be written
        (never spawning the agent, or killing its group): :meth:`outcome_of` turns that
        into a retryable internal error. Cancelled: the running agent's group is
        stopped (shielded, bounded) and the run's MCP folder removed before the
        cancellation propagates.
        """
        run, progress = held.run, held.progress
        setup, steps = self.setup, self.steps
        held.move_to(Phase.PREPARING, self._on_change)
        session = await steps.started(run.run_id, run.lane, account.name)
        self.book.started(account.name, self.clock())
        # Still "preparing" while its private checkouts are made (§5.1): heartbeats
        # and the panel show why a run has no agent yet.
        held.started_at = time.time()
        held.move_to(Phase.PREPARING if self.worktrees is not None else Phase.RUNNING,
                     self._on_change)
        if progress_log.isEnabledFor(logging.INFO):  # its parts are made only to be shown
            named = "" if len(self.book.accounts) == 1 else f" on account {account.name}"
            progress_log.info("▶ run %s started on %s%s%s", run.run_id, run.lane, named,
                              f" (resuming session {session})" if session else "")
        # The budget starts now, not at spawn: preparing the run is part of it.
        began = tally.began = trio.current_time()
        timeout_s = setup.spec.timeout_s
        deadline = began + timeout_s if timeout_s > 0 else math.inf

        def ended(said: Outcome, *, changes: list[ChangeEntry] | None = None,
                  **more: Any) -> Ending:
            return Ending(said, usage=tally.spent, changes=changes,
                           duration_ms=round((trio.current_time() - began) * 1000), **more)

        checkouts = self._checkouts() or LaneCheckouts(None, setup.bounds, self.env)
        tally.changes = checkouts.changes  # a cancel or a stop reads them too (§7)
        if self.worktrees is not None:
            progress.preparing = "preparing the private checkouts"
            ready = await checkouts.prepare(run, deadline)
            progress.preparing = None
            if not ready:
                # Done after the deadline, or just as it came: no time is left for
                # the agent.
                return ended(Outcome.failure(
                    f"preparing the private checkouts took longer than the run's "
                    f"{limit_phrase(timeout_s)} limit (--timeout), so the agent was not "
                    "started"))
            refused = checkouts.refused()
            if refused is not None:
                # A checkout that must not be handed over as it is (§13): the run
                # fails before anything of it starts, and may be sent again.
                return ended(Outcome.failure(refused, retryable=True))
            held.move_to(Phase.RUNNING, self._on_change)
        prompt = prompt_for(run, setup.spec, checkouts.prepared, confined=self.sandbox.confines)
        env = env_for(run, setup.spec, self.env, checkouts.prepared)
        try:
            # Abandoning is safe: a mkdir -p touches nothing trio owns, and the spawn
            # that needs the folder is not attempted.
            await setup.spec.folder.ensure(setup.bounds)
        except OSError as exc:
            # Named in the local log; the server hears the flag (§7: no local path).
            log.warning("run %s: could not create the working directory %s: %s",
                        run.run_id, setup.spec.workdir, exc)
            return ended(Outcome.failure(
                "could not create the working directory (--workdir): "
                f"{exc.strerror or type(exc).__name__}"), changes=await checkouts.changes())
        # Named by a digest of the run id, never the id itself (§3).
        scratch = scratch_folder(self.scratch_root, run.run_id)
        # Durable, and waited for before the agent's output is: a restart after a
        # kill -9 finds and kills this group only if it was written (§7). Raising
        # (the write failed or outlived its bound) makes the attempt kill the
        # group, and the run is reported as an internal error: a step that cannot
        # be written is never skipped.
        # With the checkouts' start state: a restart says what the run changed (§7).
        record_pgid = functools.partial(steps.record_pgid, run.run_id,
                                        start_state=checkouts.start_state())

        async def on_spawn(pgid: int) -> None:
            held.next_agent()  # a cancel kept since the last agent exited stops this one
            await record_pgid(pgid)

        def on_exit() -> None:
            held.agent_exited = True  # a cancel from now on waits for our word (§6)

        tried: set[str] = set()
        try:
            while True:
                progress.account = account.name
                # The conversation's own CLI folder of the account (issue 36, attack
                # 10), sharing the account's login (§13: no person's folder).
                lane_folder = lane_folder_name(run.lane)
                account_env = {**env, **account.env(self._agent, lane_folder)}
                attempt_env = dict(account_env)
                await share_login(account, self._agent, self.env, setup.bounds, lane_folder)
                try:
                    # Per account: a brain may build its configuration over the
                    # account's own folder (Codex's CODEX_HOME overlay).
                    wiring = await wire_mcp(run, setup.brain, mcp_folder(scratch, len(tried)),
                                            attempt_env, setup.bounds)
                except McpError as exc:
                    # After a fail-over the session is the new account's own, untouched:
                    # kept, so that the lane's turn does not forget it (§12).
                    return ended(Outcome.failure(
                        f"the run's MCP server could not be prepared, so the agent was not "
                        f"started: {exc}"), changes=await checkouts.changes(),
                        ran=bool(tried), session_id=session if tried else None,
                        account=progress.account, totals=tally.totals)
                if wiring is not None:
                    attempt_env.update(wiring.env)
                try:
                    # The account's own folders (a brain's MCP overlay of them is in
                    # the scratch folder, granted as a whole).
                    confined = await self._confine(run, checkouts, scratch, account_env,
                                                   deadline)
                except ConfinementFailed as exc:
                    # Never unconfined in its place: the run fails, saying why (§13).
                    # Nothing ran and the fault is this machine's (a hung or failing
                    # disk): retryable, like a `started` that could not be written.
                    return ended(Outcome.failure(f"{NOT_CONFINED}: {exc}", retryable=True),
                                 changes=await checkouts.changes(), ran=bool(tried),
                                 session_id=session if tried else None,
                                 account=progress.account, totals=tally.totals)
                attempt_env = confined_env(attempt_env, confined, self.sandbox.allow_write)
                await mend_session(setup.brain, session, attempt_env, confined, setup.bounds)
                before = None
                if session is not None and setup.brain.running_totals:
                    before = await self._totals_of(run.run_id, session)
                tally.totals = None
                if setup.brain.running_totals:
                    tally.attempt = (session, before, account_env)
                # §12: the budget caps the run, all its attempts together; each
                # attempt is a new CLI process counting from zero, so it is given
                # what the earlier ones left. The budget is the one the CLI obeys:
                # --max-cost's, or the user's own --max-budget-usd in --exec.
                budget = left_of(setup.brain.budget_in_force(), tally.spent)
                try:
                    result = await execute(
                        Attempt(run, prompt, attempt_env, session, deadline, wiring, before,
                                max_cost_usd=budget,
                                cwd=workdir_for(setup.spec, checkouts.prepared,
                                                None if confined is None
                                                or self.worktrees is None
                                                else confined.tmpdir),
                                confinement=None if confined is None
                                else confined.confinement),
                        setup, progress, on_spawn, timeline, on_exit)
                finally:
                    if confined is not None:
                        confined.close()
                    # A refresh the attempt made reaches the person's CLI now,
                    # before its spent refresh token logs the person out.
                    await share_login(account, self._agent, self.env, setup.bounds,
                                      lane_folder)
                tally.spent += result.spent
                tally.totals = result.session_totals
                if (tally.totals is None and setup.brain.running_totals and result.started
                        and result.session_id is not None):
                    share = await self._unreported(run.run_id, result.session_id, tally)
                    if share is not None:
                        tally.spent += share
                await self.gate.learned(account, result.limit)
                outcome, limited = result.outcome, result.ended_by_limit
                following = None
                if result.reached_budget:
                    outcome = self._over_budget(tally)
                elif limited and left_of(setup.brain.budget_in_force(), tally.spent) == 0:
                    # Nothing left for another account: the run ends at its budget
                    # (not retryable: it would spend as much again).
                    outcome, limited = self._over_budget(tally), False
                else:
                    if result.ended_by_limit:
                        # Another agent may follow: a cancel kept meanwhile stops the
                        # run here, on this account, before another is chosen.
                        held.next_agent()
                        await trio.lowlevel.checkpoint_if_cancelled()
                    following = await self._next_account(held, account, result, tried,
                                                         deadline)
                if following is None:
                    # The agent has ended with its outcome: a cancel or a stop that
                    # comes while its changes are read changes nothing (§6).
                    held.agent_ended = True
                    return ended(outcome, changes=await checkouts.changes(),
                                 ran=True, session_id=result.session_id,
                                 account=account.name, totals=tally.totals,
                                 limited=limited,
                                 confined=(confined is not None
                                           and confined.confinement.confined)
                                 if result.started else None)
                account, session = following
        finally:
            await remove_scratch(run, scratch, setup.bounds, made=self.sandbox.confines)

    def _checkouts(self) -> LaneCheckouts | None:
        """A run's view of its lane's checkouts; ``None`` without ``--repos``."""
        if self.worktrees is None:
            return None
        return LaneCheckouts(self.worktrees, self.setup.bounds, self.env, self.sandbox,
                             self.scratch_root)

    async def _confine(self, run: AgentRun, checkouts: LaneCheckouts, scratch: Path,
                       env: Mapping[str, str], deadline: float) -> RunConfinement | None:
        """The attempt's confinement (§13), made anew, ``None`` when runs are not
        confined; raises :class:`ConfinementFailed`. Cancelled: as :func:`confine`."""
        if not self.sandbox.confines:
            return None
        prepared = checkouts.prepared
        places = RunPlaces(
            workdir=None if self.worktrees is not None else self.setup.spec.workdir,
            worktrees=tuple(Path(c.path) for c in prepared.checkouts) if prepared else (),
            lane_folder=prepared.folder if prepared else None,
            scratch=scratch, brain=self._agent, env=env,
            git=tuple(c.git for c in prepared.checkouts if c.git) if prepared else (),
            lane=run.lane)
        return await confine(self.sandbox, places, deadline, self.setup.bounds)

    def _over_budget(self, tally: Tally) -> Outcome:
        """The run reached its budget (§12), in words of its own: the budget in force
        and what the whole run spent, the figure its ``usage.cost_usd`` says, not the
        last attempt's. The rest (session, usage, duration, account) is added where
        every outcome is finished, :meth:`Ending.outcome`."""
        return Outcome.failure(budget_reached(self.setup.brain.budget_in_force(),
                                              tally.spent.cost_usd))

    async def _next_account(self, held: HeldRun, account: Account, result: AttemptResult,
                            tried: set[str], deadline: float
                            ) -> tuple[Account, str | None] | None:
        """The account the run goes on with after ``result``, with the lane's session
        there: ``None`` unless the attempt ended at ``account``'s usage limit and
        another account can take the run before ``deadline``.

        Cancelled: nothing to undo (a wait for an account just ends).
        """
        if not result.ended_by_limit:
            return None
        tried.add(account.name)
        if trio.current_time() >= deadline:
            return None
        book = self.book
        following = book.choose(self.clock(), exclude=frozenset(tried))
        if following is None and book.all_limited(self.clock()):
            # No other account can take it now: wait like a queued run (§12),
            # within the run's --timeout as well as --limit-wait.
            with trio.move_on_at(deadline):
                waited = await self.gate.wait_for_account(held.run_id, held.progress, None)
                following = waited if isinstance(waited, Account) else None
        if following is None:
            return None
        session = await self.steps.account_session(held.run.lane, following.name)
        book.started(following.name, self.clock())
        self._on_change()
        log.warning("run %s: account %s is at its usage limit (%s); running it again "
                    "on account %s", held.run_id, account.name, result.outcome.error,
                    following.name)
        return following, session

    async def _totals_of(self, run_id: str, session_id: str) -> Usage:
        """What the resumed session had reached (§7: Codex reports running totals).
        Unreadable: the run goes on, its figures then the totals'.

        Cancelled: as :meth:`LedgerSteps.session_totals` (a read).
        """
        try:
            text = await self.steps.session_totals(session_id)
            return Usage.from_json(json.loads(text)) if text else Usage()
        except (LedgerError, OSError, ValueError) as exc:
            log.warning("run %s: could not read session %s's usage so far: %s",
                        run_id, session_id, exc)
            return Usage()

    async def _unreported(self, run_id: str, session_id: str, tally: Tally) -> Usage | None:
        """This attempt's share of ``session_id``'s running totals when its CLI
        printed none (Codex reports a turn's usage only when it completes): read
        from where the CLI records them (Codex's session rollout file), less what
        the session had reached before (§7), and ``tally.totals`` set to them. When
        they cannot be read, ``None``, and ``tally.totals`` says the session went on
        from the last known totals, so that the next turn's difference, which then
        holds this one's tokens too, says so (``includes_earlier_turns``).

        Cancelled: as :meth:`prohost.engine.blocking.Bounds.file_step` (a read).
        """
        if tally.attempt is None:  # no attempt of a CLI reporting running totals
            return None
        resumed, before, env = tally.attempt
        known = before if session_id == resumed and before is not None else Usage()
        brain = self.setup.brain
        recorded = None
        if isinstance(brain, RecordsTotals):
            try:
                # Abandoning it is safe: a read of the CLI's own file.
                recorded = await self.setup.bounds.file_step(
                    brain.recorded_totals, session_id, env,
                    what="reading the agent's session totals", limit_s=5.0)
            except OSError as exc:
                log.warning("run %s: could not read session %s's totals where the "
                            "agent records them: %s", run_id, session_id, exc)
        if recorded is None:
            tally.totals = attrs.evolve(known, includes_earlier_turns=True)
            return None
        tally.totals = recorded
        earlier = True if known.includes_earlier_turns else None
        return attrs.evolve(recorded.since(known), turns=1, includes_earlier_turns=earlier)

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
        self._on_outcome(held, outcome)
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
