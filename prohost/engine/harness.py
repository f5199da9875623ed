"""The supervisor: one nursery holding the link, the scheduler, and every run.

A run's life, and who owns each step::

    delivery ─ admission: classify, steps.admit, hold, scheduler.submit, ack   (the reader)
    scheduler ─ _work ─ runner: started, attempts, finished, report             (one task)
    cancelled while queued, drained, recovered ─ queue.settle ─ scheduler ─ _work
        ─ runner.settle_only: finished, report           (its lane's turn, no slot)

Everything a run needs to be stopped is on its :class:`HeldRun`: ``exec_scope``
stops the agent (the run is still reported: a cancel, a second signal) and
``life_scope`` stops everything, reporting included (the server said it no longer
knows the run). The ledger write before each step is what lets a restarted harness
pick up exactly where this one died (§7).

The composition root: it builds every part and hands each only what it uses (none
of them knows this class), and keeps the supervisor's own job: cancel and forget,
drain and stop. See docs/architecture.md, "Rooms", for who is handed what.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

import trio

from prohost.engine import lognames
from prohost.engine.accounts.book import DEFAULT_ACCOUNT, Account, AccountBook
from prohost.engine.accounts.gate import AccountGate
from prohost.engine.accounts.logins import owned_folder
from prohost.engine.agent.brains import brain_for
from prohost.engine.agent.process import ProcessGroups
from prohost.engine.blocking import Bounds
from prohost.engine.changes import Changes
from prohost.engine.lanes.scheduler import Scheduler, Slot
from prohost.engine.ledger import Ledger
from prohost.engine.ledger.steps import LedgerSteps
from prohost.engine.link.beacon import Beacon
from prohost.engine.link.connection import CredentialsRejected, Endpoints, Link, Session
from prohost.engine.report.outbox import Outbox, ReportTiming
from prohost.engine.report.reporter import Reporter
from prohost.engine.report.sender import Sender
from prohost.engine.repos.worktrees import WorktreeManager
from prohost.engine.run.attempts import Attempts
from prohost.engine.run.checkouts import git_confinement
from prohost.engine.run.confine import Sandbox
from prohost.engine.run.execute import AgentSetup, ExecSpec
from prohost.engine.run.heldrun import HeldRun, Phase, ReportOnly
from prohost.engine.run.queued_bodies import QueuedBodies
from prohost.engine.run.runner import Runner
from prohost.engine.run.workspace import Workspaces
from prohost.engine.supervisor.admission import Admission, AdmissionPolicy, Intake
from prohost.engine.supervisor.dryrun import DryRun
from prohost.engine.supervisor.held import HeldRuns
from prohost.engine.supervisor.recovery import Recovery
from prohost.engine.supervisor.runqueue import RunQueue
from prohost.engine.supervisor.upkeep import Chores, sweep_overlays, sweep_scratch
from prohost.engine.view.snapshot import Snapshot
from prohost.engine.view.status_file import (
    Facts,
    Observed,
    heartbeat_runs,
    status_message,
    take_snapshot,
)
from prohost.options import Options
from prohost.wire import intake
from prohost.wire.outcomes import DEFAULT_CANCEL_REASON, NOT_STARTED, STOPPED, cancelled
from prohost.wire.protocol import Cancel, Delivery, HeartbeatAck, Message
from prohost.wire.runs import Outcome

log = logging.getLogger(lognames.HARNESS)

T = TypeVar("T")

#: After a second signal, everything left must be done within this (seconds, §9).
STOP_WINDOW_S = 5.0
#: Grace between SIGTERM and SIGKILL after a second signal (seconds, §9).
STOP_GRACE_S = 3.0


async def _no_ledger(limits: dict[str, float]) -> None:
    """A dry run keeps no ledger: the accounts' limits are remembered in memory only."""


class Harness:
    """Accepts, runs and reports; see the module docstring."""

    def __init__(
        self,
        options: Options,
        endpoints: Endpoints,
        *,
        client: Sender,
        ledger: Ledger | None,
        env: Mapping[str, str] | None = None,
        timing: ReportTiming | None = None, clock: Callable[[], float] = time.time,
    ) -> None:
        self.options = options
        #: Told of every change of runs, connection or drain: every part is handed
        #: its ``notify`` (the beacon and the status file wait on it).
        self.state_changed = Changes()
        changed = self.state_changed.notify
        #: Epoch seconds, for the accounts' resets (§12); tests move it with trio's.
        self.clock = clock
        self.endpoints = endpoints
        self.ledger = ledger
        self.brain = brain_for(options.brain, options.exec_command, safe_tools=options.safe_tools,
                               max_cost_usd=options.max_cost_usd, acp_model=options.acp_model,
                               acp_mode=options.acp_mode, accounts=options.accounts)
        self.env = dict(os.environ if env is None else env)
        #: How agents are confined (§13): the system asked once, here.
        self.sandbox = Sandbox.start(options, self.env)
        self.groups = ProcessGroups()
        self.bounds = Bounds()  # every blocking file step's; stop() hurries them
        self.steps = None if ledger is None else LedgerSteps(ledger, self.bounds)
        #: How long reports are retried, and when a waiting one is dropped (§7).
        self.timing = timing if timing is not None else ReportTiming()
        self.reporter = Reporter(client, endpoints.api_base, endpoints.token,
                                 window_s=self.timing.window_s)
        self.scheduler: Scheduler[HeldRun | ReportOnly] = Scheduler(
            options.concurrency, self._work, queue_cap=options.max_queued)
        self.link = Link(endpoints.ws_url, endpoints.headers(options.machine), self,
                         on_change=changed)
        self.worktrees = WorktreeManager(options.home, options.repos, bounds=self.bounds)
        #: The agent accounts (--account) and their usage limits (docs/protocol.md §12).
        #: Without --account, the default account's CLI folders are the harness's own
        #: (§13: never the person's ~/.claude or ~/.codex), sharing the person's login.
        self.book = AccountBook(
            [Account(name, folder, own=owned_folder(options.home, name))
             for name, folder in options.accounts]
            or [Account(DEFAULT_ACCOUNT, owned_folder(options.home, DEFAULT_ACCOUNT), owned=True)])
        #: The queued runs' body texts and their budget.
        self.bodies = QueuedBodies()
        #: What the harness learnt about itself (version, model, latest runs).
        self.facts = Facts(on_change=changed, model=self.brain.configured_model())
        #: Where runs' MCP folders go (each named by a digest of its run id).
        self.scratch_root = options.home / "runs"
        #: Which account each run starts on, and the wait while none can (§12).
        self.gate = AccountGate(
            self.book, limit_wait_s=options.limit_wait_s, clock=clock, on_change=changed,
            save_limits=self.steps.save_limits if self.steps is not None else _no_ledger)
        self.held = HeldRuns(on_change=changed)
        self.queue = RunQueue(self.scheduler, self.bodies, changed)
        policy = AdmissionPolicy(max_queued=options.max_queued,
                                 allow_unverified=options.allow_unverified)
        #: The ledger's parts: none in a dry run, which answers deliveries from
        #: memory instead and never holds a run (the one choice of the two kinds).
        self.outbox: Outbox | None = None
        self.runner: Runner | None = None
        self.recovery: Recovery | None = None
        self.admission: Intake
        if self.steps is None:
            self.admission = DryRun(secret=endpoints.secret, policy=policy, queue=self.queue)
        else:
            #: Reports that outlived their retry window, tried again (§7).
            self.outbox = Outbox(self.reporter, self.steps, timing=self.timing,
                                 on_change=changed)
            setup = AgentSetup(
                self.brain,
                ExecSpec.from_options(options, secrets=(endpoints.token, endpoints.secret)),
                self.groups, self.bounds)
            self.runner = Runner(
                steps=self.steps, outbox=self.outbox,
                workspaces=Workspaces(setup=setup, env=self.env, worktrees=self.worktrees
                                      if self.worktrees.enabled else None,
                                      scratch_root=self.scratch_root, sandbox=self.sandbox,
                                      agent=self.brain.folders_owner),
                attempts=Attempts(setup=setup, steps=self.steps, gate=self.gate, clock=clock,
                                  on_change=changed),
                on_change=changed, on_outcome=self.facts.note_outcome,
                bodies=self.bodies,
            )
            self.recovery = Recovery(
                steps=self.steps, runs=self.held, queue=self.queue, book=self.book,
                outbox=self.outbox, clock=clock, spend=self.facts.spend, bounds=self.bounds,
                home=options.home)
            self.admission = Admission(
                secret=endpoints.secret, book=self.book, runs=self.held, queue=self.queue,
                steps=self.steps, take_on=self.recovery.resume_unheld, policy=policy,
                later=lambda fn, run_id: self._running_nursery().start_soon(fn, run_id))
        outbox = self.outbox
        self.stopping = False
        self.exit_code = 0
        self.observed = Observed(
            options=options, server=endpoints.ws_url, brain=self.brain, facts=self.facts,
            runs=self.held, book=self.book, clock=clock, link=self.link.statistics,
            scheduler=self.scheduler.statistics, outbox=outbox,
            last_heartbeat_at=lambda: self.beacon.last_heartbeat_at,
            draining=lambda: self.queue.draining, stopping=lambda: self.stopping,
            confinement=self.sandbox.describe())
        self.beacon = Beacon(functools.partial(status_message, self.observed),
                             functools.partial(heartbeat_runs, self.held, outbox),
                             self.state_changed)
        self.chores = Chores(
            seen=self.observed, env=self.env, hold=self.scheduler.holding, bounds=self.bounds,
            changes=self.state_changed, steps=self.steps,
            gate=None if self.runner is None else self.gate,
            worktrees=self.worktrees.enabled, git_confine=git_confinement(self.sandbox))
        self._done = trio.Event()
        self._nursery: trio.Nursery | None = None
        #: Until the ledger has been read at start, "nothing held" does not mean idle.
        self._recovered = False
        self._link_scope = trio.CancelScope()
        self._link_closed = trio.Event()
        #: When a stop's window closes (trio time, seconds); set by stop().
        self._stop_deadline = math.inf

    # ------------------------------------------------------------------ life

    async def run(self, *, task_status: trio.TaskStatus[Harness] = trio.TASK_STATUS_IGNORED) -> int:
        """Run until drained, stopped, or the credentials are rejected; return the exit code.

        Reports started once the scheduler is up, the ledger recovered and the link
        dialling (not necessarily connected). A :meth:`drain` or :meth:`stop` that
        came before (a signal while the process started) or during the recovery is
        obeyed: recovered runs are reported as §9 says, and it exits only once they
        are. Cancelled from outside: running agents are stopped (their groups
        killed, shielded and bounded) and the cancel propagates; their ledger rows
        stay as they were, for the next start.
        """
        if self._done.is_set() or self._nursery is not None:
            raise RuntimeError("Harness.run() was called twice; make a new Harness")
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if self.steps is not None:  # the ledger's writer thread, joined on exit
                    await nursery.start(self.steps.writer)
                if self.stopping:
                    nursery.cancel_scope.deadline = self._stop_deadline
                if self.queue.draining:
                    nursery.start_soon(self._exit_when_idle)
                await nursery.start(self.scheduler.run)
                if self.recovery is not None:
                    # Before any run can start: every MCP folder there is a leftover.
                    await sweep_scratch(self.scratch_root, self.bounds)
                    await sweep_overlays(self.options.home, self.bounds)
                    await self.recovery.recover()
                await nursery.start(self._guard_link)
                # Only now may a drain end the harness: the recovered runs are held,
                # and the link is up for _exit_when_idle to close.
                self._recovered = True
                self.changed()
                if self.outbox is not None:
                    # Reports that outlived their window, tried again until they
                    # settle (§7).
                    nursery.start_soon(self.outbox.run)
                self.chores.start(nursery)
                self._say_confinement()
                task_status.started(self)
                await self._done.wait()
                nursery.cancel_scope.cancel()
        finally:
            # No new task may be started in a closed nursery (a late signal).
            self._nursery = None
            self._done.set()
            # Whatever happened above, no agent outlives the harness.
            self.groups.kill_all(signal.SIGKILL)
            self.sandbox.close()
        return self.exit_code

    async def wait_recovered(self) -> None:
        """Return once the previous process's runs are held (the ledger read at
        start): from then on a run this harness does not hold is none of its own.
        Cancelling it only stops the wait."""
        await self.wait_until(lambda harness: harness._recovered)

    def _say_confinement(self) -> None:
        """Say once, at start, whether agents run confined (§13): a warning when
        ``--sandbox auto`` finds the system cannot (runs go on unconfined)."""
        if self.sandbox.complete:
            log.info("agents run %s", self.sandbox.describe())
        elif self.sandbox.confines:
            log.warning("agents run %s; each completion says \"confined\": false (use "
                        "--sandbox required to refuse to run without every point of §13)",
                        self.sandbox.describe())
        elif self.options.sandbox == "off":
            log.info("agents run unconfined (--sandbox off)")
        else:
            log.warning("agents run NOT confined: %s; each completion says "
                        "\"confined\": false (use --sandbox required to refuse to run "
                        "unconfined)", self.sandbox.describe().removeprefix("NOT confined: "))

    async def _guard_link(self, *, task_status: trio.TaskStatus[None]) -> None:
        """The link, until cancelled or closed by the end of a drain.

        Cancelled: the connection closes (the link's own shielded, bounded close).
        """
        try:
            with self._link_scope:
                await self.link.run(task_status=task_status)
        except CredentialsRejected as exc:
            log.error("%s", exc)
            self.exit_code = 1
            self._done.set()
        finally:
            self._link_closed.set()

    def drain(self) -> None:
        """First signal (§9): take no new work, report what has not started (queued, or
        waiting for an account), finish the rest.

        Safe at any moment: before :meth:`run` (it is obeyed once run starts),
        during the restart recovery (recovered runs are then reported, not queued),
        and after run returned (nothing is left to do).
        """
        if self.queue.draining:
            return
        self.queue.draining = True
        stats = self.scheduler.statistics()  # executing, or done and still being reported
        log.info("draining: finishing %d running run(s); new work is refused",
                 stats.running + stats.reporting)
        for _key, item in self.scheduler.drain():
            if isinstance(item, HeldRun):  # (only runs are handed back)
                self.queue.settle(item, Outcome.failure(NOT_STARTED, retryable=True))
        # Runs waiting for an account are handed back like queued ones (§9), rather
        # than holding the drain up to --limit-wait.
        self.gate.turn_away(Outcome.failure(NOT_STARTED, retryable=True))
        self.changed()
        if self._nursery is not None:
            self._nursery.start_soon(self._exit_when_idle)
        # Otherwise run() starts it, or has returned already.

    def stop(self) -> None:
        """Second signal (§9): stop every agent and report it, all within 5 s.

        Safe at any moment, like :meth:`drain`.
        """
        if self.stopping:
            return
        self.drain()
        self.stopping = True
        self.exit_code = 130
        self.groups.grace_s = STOP_GRACE_S
        self._stop_deadline = trio.current_time() + STOP_WINDOW_S
        log.warning("stopping: every running agent is terminated now")
        for held in list(self.held.values()):
            if held.state is not Phase.REPORTING and not held.agent_ended:
                # A cancel the run already holds stays its outcome (§6: a cancel is
                # final): reported "stopped", retryable, the server would run the
                # cancelled request again.
                if held.stop_outcome is None:
                    held.stop_outcome = Outcome.failure(STOPPED, retryable=True)
                held.stop_agent()
        if self._nursery is not None:
            # Whatever has not reported by then stays in the ledger's outbox.
            self._nursery.cancel_scope.deadline = self._stop_deadline
        self.bounds.hurry(self._stop_deadline)  # steps stuck on a hung disk give up too

    async def _exit_when_idle(self) -> None:
        """End the harness once a drain has nothing left: every run reported, or
        (logged by name) left in the ledger's outbox for the next start.

        Cancelled (a stop's deadline): whatever is unreported stays in the ledger.
        """
        # Held covers every queued, running and reporting run; recovery may still
        # be about to hold the runs of the previous process.
        await self.wait_until(lambda harness: harness._recovered and not harness.held)
        recovery = self.recovery
        if recovery is not None:
            # No delivery can be in the middle of being admitted after this: one
            # whose ledger write raced the drain would otherwise be left behind.
            # Closed as one that goes on purpose: the server does not expect it back.
            self.link.leave()
            self._link_scope.cancel()
            await self._link_closed.wait()
            await recovery.sweep_ledger()
            await self.wait_until(lambda harness: not harness.held)
            if not await recovery.ledger_settled():
                self.exit_code = self.exit_code or 1
                self._done.set()
                return
        if self.stopping:
            # Runs were stopped, not finished: "drained" would be untrue (issue 31).
            log.info("stopped: every run that was running was stopped and reported")
        else:
            log.info("drained: every run has finished and reported")
        self._done.set()

    # ------------------------------------------------------------------ link handler

    async def on_session(
        self, session: Session, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """For the life of one connection: the beacon's status and heartbeats.

        Reports started once status and the first heartbeat are out (§1). A new
        connection means the server answers again: the reports waiting in the
        outbox are tried now (§7). Cancelled when the connection drops; nothing
        to clean up.
        """
        if self.outbox is not None:
            self.outbox.poke()
        await self.beacon.serve(session, task_status=task_status)

    async def on_message(self, session: Session, message: Message) -> Message | None:
        """Handle one message; return what the link sends back at once (a
        delivery's ack, if it is known already). Never raises for anything the
        server sends.

        Cancelled (the connection dropped): as
        :meth:`prohost.engine.supervisor.admission.Admission.answer`.
        """
        if isinstance(message, Delivery):
            return await self.admission.answer(session, message)
        if isinstance(message, Cancel):
            # The reason goes into the run's report: make it text that can be sent.
            reason = intake.clean_text(message.reason) if message.reason else None
            self.cancel(message.run_id, reason or DEFAULT_CANCEL_REASON)
        elif isinstance(message, HeartbeatAck):
            for run_id in message.cancel:
                self.cancel(run_id, DEFAULT_CANCEL_REASON, quiet=True)
            for run_id in message.unknown:
                self.forget(run_id)
        else:
            log.debug("ignored a %s message from the server", type(message).__name__)
        return None

    # ------------------------------------------------------------------ cancel

    def cancel(self, run_id: str, reason: str, *, quiet: bool = False) -> None:
        """Stop a run and report it cancelled (§6). Unknown runs are ignored."""
        held = self.held.get(run_id)
        if held is not None and held.agent_ended and held.state is not Phase.REPORTING:
            # §6: an agent that had already exited with its reply is reported as
            # it finished (its changes are being read, its outcome written).
            log.info("ignored a cancel for run %s: its agent had already finished", run_id)
            return
        if (held is None or held.state is Phase.REPORTING
                or (held.stop_outcome is not None and held.stop_outcome.error != STOPPED)):
            (log.debug if quiet or held is not None else log.info)(
                "ignored a cancel for run %s: not running here", run_id
            )
            return
        outcome = Outcome.failure(cancelled(reason))
        log.info("cancelling run %s: %s", run_id, reason)
        # Final from now on (§6), whatever follows: a second signal keeps it, and
        # the ledger keeps it (before the agent is stopped), so a kill -9 and a
        # restart report it cancelled too and never start it again.
        if not self.queue.settle(held, outcome):  # a queued one keeps its place (§4)
            held.stop_outcome = outcome
            if self.steps is None or self._nursery is None:
                held.stop_agent()
                return
        if self.steps is not None and self._nursery is not None:
            self._nursery.start_soon(self._cancel_running, held, outcome)

    async def _cancel_running(self, held: HeldRun, outcome: Outcome) -> None:
        """Record ``held``'s cancel durably (§6), then stop its agent, if it has left
        the queue. A ledger that cannot take it is logged and the agent is stopped
        all the same (the run is reported cancelled; only a kill -9 before its
        report would lose the cancel).

        Cancelled (the harness ends): the agent is stopped by the nursery's end.
        """
        assert self.steps is not None
        try:
            await self.steps.cancelled(held.run_id, outcome.to_json())
            log.info("run %s: its cancel is kept; stopping its agent", held.run_id)
        except Exception as exc:
            log.error("run %s: its cancel could not be kept in the ledger (%s); stopping "
                      "its agent all the same", held.run_id, exc)
        finally:
            # A queued run has no agent; one that ended is reported as it finished.
            if held.stop_outcome is not None and not held.agent_ended:
                held.stop_agent()

    def forget(self, run_id: str) -> None:
        """The server no longer knows the run: stop it and never report it (§2)."""
        held = self.held.get(run_id)
        if held is None:
            if self.outbox is not None and self.outbox.forget(run_id):
                log.info("run %s is closed on the server; its waiting report is dropped",
                         run_id)
                self._running_nursery().start_soon(
                    self.outbox.record, run_id, "dropped: closed on the server")
            return
        log.info("run %s is closed on the server; stopping it without a report", run_id)
        held.dropped = True
        held.life_scope.cancel()
        if self.scheduler.remove(run_id) is not None:
            self._running_nursery().start_soon(self._then_release, held, functools.partial(
                self._runner().record_dropped, held))
            self.changed()

    async def _work(self, run_id: str, item: HeldRun | ReportOnly, slot: Slot) -> None:
        """The scheduler's work for one run, once its lane is its own: the runner
        executes and reports it, giving its ``slot`` back as soon as its outcome is
        durable; or, for a run that only needs reporting (no slot), reports it. The
        lane goes back when this returns, after the report (§4). Cancelled: as
        :meth:`Runner.run`; the run is let go either way.
        """
        self.changed()
        runner = self._runner()
        if isinstance(item, ReportOnly):
            await self._then_release(item.held, functools.partial(
                runner.settle_only, item.held, item.outcome, recorded=item.recorded,
                finished_at=item.finished_at))
        else:
            await self._then_release(item, functools.partial(runner.run, item, slot))

    def _running_nursery(self) -> trio.Nursery:
        if self._nursery is None:
            raise RuntimeError("the harness is not running (Harness.run() has not started "
                               "or has returned): no task can be started for a run")
        return self._nursery

    async def _then_release(self, held: HeldRun, step: Callable[[], Awaitable[None]]) -> None:
        """One of the runner's steps for ``held``, then the run is let go.
        Cancelled: as the step; let go either way."""
        try:
            await step()
        finally:
            self._release(held)

    def _runner(self) -> Runner:
        # Only a harness with a ledger executes or reports anything (not a dry run).
        if self.runner is None:
            raise RuntimeError("a dry run (no ledger) cannot execute or report a run")
        return self.runner

    def _release(self, held: HeldRun) -> None:
        self.bodies.drop(held)  # a queued run forgotten, or one whose body was not loaded
        self.held.release(held)

    def changed(self) -> None:
        self.state_changed.notify()

    async def wait_until(self, predicate: Callable[[Harness], bool]) -> None:
        """Return once ``predicate(self)`` holds, re-checked after every change of
        runs, connection or drain state. Cancelling it only stops the wait."""
        while not predicate(self):
            await self.state_changed.wait()

    def snapshot(self) -> Snapshot:
        """A frozen picture of this moment, for the panel and ``agent status``."""
        return take_snapshot(self.observed)

