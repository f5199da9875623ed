"""The supervisor: one nursery holding the link, the scheduler, and every run.

A run's life, and who owns each step::

    delivery ─ intake.classify ─ ledger.admit ─ ack ─ scheduler.submit      (the reader)
    scheduler ─ _work: started ─ execute ─ finished ─ report ─ reported       (one task)

Everything a run needs to be stopped is on its :class:`HeldRun`: ``exec_scope``
stops the agent (the run is still reported — a cancel, a second signal) and
``life_scope`` stops everything, reporting included (the server said it no longer
knows the run). The ledger write before each step is what lets a restarted harness
pick up exactly where this one died (§7).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import math
import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import attrs
import httpx
import trio

from prohost import AGENT_HEADER_VALUE, __version__, intake
from prohost.accounts import Account, AccountBook
from prohost.agentproc import ProcessGroups
from prohost.blocking import StepTimedOut
from prohost.brains import brain_for
from prohost.execute import ExecSpec
from prohost.heartbeat import Beacon
from prohost.ledger import Admission, Ledger, LedgerError, LedgerRow, RunState
from prohost.link import CredentialsRejected, Link, Session
from prohost.options import Options
from prohost.procinfo import process_belongs_to_run
from prohost.protocol import (
    AccountRow,
    Ack,
    Cancel,
    Delivery,
    HeartbeatAck,
    Message,
    Status,
)
from prohost.reporter import Reporter
from prohost.runner import (
    LEDGER_STEP_TIMEOUT_S,
    HeldRun,
    Runner,
    all_limited_reason,
    iso_time,
    progress_log,
)
from prohost.runs import AgentRun, BodyError, Outcome, parse_body
from prohost.scheduler import QueueFullError, Scheduler
from prohost.snapshot import (
    REFRESH_S,
    STATUS_FILE,
    Connection,
    FinishedRow,
    RunRow,
    Snapshot,
    write_snapshot,
)
from prohost.worktrees import WorktreeManager, collect_garbage, is_checkout

log = logging.getLogger("prohost.harness")

T = TypeVar("T")

#: After a second signal, everything left must be done within this (§9).
STOP_WINDOW_S = 5.0
#: Grace between SIGTERM and SIGKILL after a second signal (§9).
STOP_GRACE_S = 3.0
#: Reported rows older than this are pruned (§7), checked this often.
PRUNE_AGE_S = 7 * 86400.0
PRUNE_EVERY_S = 86400.0
#: Worktrees of lanes idle this long are collected by the daily pass.
WORKTREE_IDLE_S = 14 * 86400.0
#: `claude --version` and the like answer at once; a hung one must not matter.
BRAIN_PROBE_TIMEOUT_S = 10.0
#: The panel and status file show this many of the latest finished runs.
FINISHED_KEPT = 5
#: status.json is rewritten at most this often.
STATUS_FILE_MIN_INTERVAL_S = 1.0

NOT_STARTED = "the agent is shutting down; the run was not started"
QUEUE_FULL = "the agent's queue is full; the run was not started"
STOPPED = "the agent was stopped"
INTERRUPTED = "the harness lost track of this run before it finished"
RESTARTED = "the harness restarted before this run finished"
DEFAULT_CANCEL_REASON = "cancelled by the server"


@attrs.frozen
class Endpoints:
    ws_url: str
    api_base: str
    token: str
    secret: str


class Harness:
    """Accepts, runs and reports; see the module docstring."""

    def __init__(
        self,
        options: Options,
        endpoints: Endpoints,
        *,
        client: httpx.AsyncClient,
        ledger: Ledger | None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.options = options
        self.endpoints = endpoints
        self.ledger = ledger
        self.brain = brain_for(options.brain, options.exec_command, safe_tools=options.safe_tools)
        self.brain_version: str | None = None
        self.model: str | None = self.brain.configured_model()
        self.env = dict(os.environ if env is None else env)
        self.groups = ProcessGroups()
        self.reporter = Reporter(client, endpoints.api_base, endpoints.token)
        self.scheduler: Scheduler[HeldRun] = Scheduler(options.concurrency, self._work)
        self.link = Link(
            endpoints.ws_url,
            [
                (b"Authorization", f"Bearer {endpoints.token}".encode()),
                (b"X-Prohost-Machine", options.machine.encode()),
                (b"X-Prohost-Agent", AGENT_HEADER_VALUE.encode()),
            ],
            self,
            on_change=self._changed,
        )
        self.spec = ExecSpec(
            command=options.exec_command,
            workdir=options.workdir,
            timeout_s=options.timeout_s,
            idle_timeout_s=options.idle_timeout_s,
            parallel=options.concurrency > 1,
            secrets=(endpoints.token, endpoints.secret),
        )
        self.worktrees = WorktreeManager(options.home, options.repos)
        #: The agent accounts (--account) and their usage limits (PROTOCOL.md §12).
        self.book = AccountBook(Account(name, folder) for name, folder in options.accounts)
        self.runner = None if ledger is None else Runner(
            spec=self.spec,
            brain=self.brain,
            ledger=ledger,
            reporter=self.reporter,
            groups=self.groups,
            env=self.env,
            worktrees=self.worktrees if self.worktrees.enabled else None,
            scratch_root=options.home / "runs",
            on_change=self._changed,
            on_outcome=self._on_outcome,
            book=self.book,
            limit_wait_s=options.limit_wait_s,
        )
        self.held: dict[str, HeldRun] = {}
        self.draining = False
        self.stopping = False
        self.exit_code = 0
        self._dry_seen: set[str] = set()
        self._finished: collections.deque[FinishedRow] = collections.deque(maxlen=FINISHED_KEPT)
        self.beacon = Beacon(self._status, lambda: [h.beat() for h in self.held.values()])
        self._state_changed = trio.Event()
        self._status_written = trio.Event()
        self._done = trio.Event()
        self._nursery: trio.Nursery | None = None
        #: Until the ledger has been read at start, "nothing held" does not mean idle.
        self._recovered = False
        self._link_scope = trio.CancelScope()
        self._link_closed = trio.Event()
        #: Runs the end-of-drain sweep already reported once (never twice).
        self._swept: set[str] = set()
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
                if self.stopping:
                    nursery.cancel_scope.deadline = self._stop_deadline
                if self.draining:
                    nursery.start_soon(self._exit_when_idle)
                await nursery.start(self.scheduler.run)
                await self._recover()
                await nursery.start(self._guard_link)
                # Only now may a drain end the harness: the recovered runs are held,
                # and the link is up for _exit_when_idle to close.
                self._recovered = True
                self._changed()
                if self.ledger is not None:
                    nursery.start_soon(self._prune_daily)
                    if self.worktrees.enabled:
                        nursery.start_soon(self._collect_worktrees_daily)
                nursery.start_soon(self._probe_brain)
                if self.runner is not None:
                    nursery.start_soon(self._announce_resets, self.runner)
                if not self.options.dry_run:
                    nursery.start_soon(self._keep_status_file)
                self._announce()
                task_status.started(self)
                await self._done.wait()
                nursery.cancel_scope.cancel()
        finally:
            # No new task may be started in a closed nursery (a late signal).
            self._nursery = None
            self._done.set()
            # Whatever happened above, no agent outlives the harness.
            self.groups.kill_all(signal.SIGKILL)
        return self.exit_code

    def _announce(self) -> None:
        options = self.options
        mode = " (dry run: nothing is executed or reported)" if options.dry_run else ""
        log.info(
            "prohost %s on %s: up to %d run(s) at once with %r in %s%s",
            __version__,
            options.machine,
            options.concurrency,
            options.exec_command,
            options.workdir,
            mode,
        )
        if options.repos:
            log.info("each conversation gets its own worktree of: %s",
                     ", ".join(map(str, options.repos)))
            for repo in options.repos:
                if not is_checkout(repo):
                    log.warning("--repos: %s is not a git checkout right now; runs will be "
                                "told it is read-only until it is", repo)
        elif options.concurrency > 1:
            log.info("no --repos: runs in parallel share every checkout on this machine; "
                     "name the repositories the agent edits with --repos to give each "
                     "conversation its own")
        if self.brain.name == "claude" and not options.safe_tools and _is_root():
            log.warning(
                "running as root: Claude Code refuses --dangerously-skip-permissions for "
                "root, so every run will fail; run the harness as a normal user, or pass "
                "--safe-tools to keep the CLI's permission prompts"
            )
        if options.allow_unverified:
            log.warning(
                "--allow-unverified: deliveries with a missing or wrong signature are accepted"
            )

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
        """First signal (§9): take no new work, report what has not started, finish the rest.

        Safe at any moment: before :meth:`run` (it is obeyed once run starts),
        during the restart recovery (recovered runs are then reported, not queued),
        and after run returned (nothing is left to do).
        """
        if self.draining:
            return
        self.draining = True
        log.info("draining: finishing %d running run(s); new work is refused", self._running())
        for _key, held in self.scheduler.drain():
            self._settle_soon(held, Outcome.failure(NOT_STARTED, retryable=True))
        self._changed()
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
        # Whatever has not reported by then stays in the ledger's outbox.
        self._stop_deadline = trio.current_time() + STOP_WINDOW_S
        log.warning("stopping: every running agent is terminated now")
        for held in list(self.held.values()):
            if held.state != "reporting":
                held.stop_outcome = Outcome.failure(STOPPED, retryable=True)
                held.exec_scope.cancel()
        if self._nursery is not None:
            # Whatever has not reported by then stays in the ledger's outbox.
            self._nursery.cancel_scope.deadline = self._stop_deadline
        # Shielded ledger steps stuck on a hung disk give up by then too.
        if self.runner is not None:
            self.runner.bounds.hurry(self._stop_deadline)

    async def wait_released(self, run_id: str) -> None:
        """Return once ``run_id`` is no longer held (reported, dropped, or never held).

        Cancelling it only stops the wait.
        """
        await self.wait_until(lambda harness: run_id not in harness.held)

    async def _exit_when_idle(self) -> None:
        """End the harness once a drain has nothing left: every run reported, or
        (logged by name) left in the ledger's outbox for the next start.

        Cancelled (a stop's deadline): whatever is unreported stays in the ledger.
        """
        # Held covers every queued, running and reporting run; recovery may still
        # be about to hold the runs of the previous process.
        await self.wait_until(lambda harness: harness._recovered and not harness.held)
        if self.ledger is not None:
            # No delivery can be in the middle of being admitted after this: one
            # whose ledger write raced the drain would otherwise be left behind.
            self._link_scope.cancel()
            await self._link_closed.wait()
            await self._sweep_ledger()
            await self.wait_until(lambda harness: not harness.held)
            if not await self._ledger_settled():
                self.exit_code = self.exit_code or 1
                self._done.set()
                return
        log.info("drained: every run has finished and reported")
        self._done.set()

    async def _unreported(self) -> list[LedgerRow]:
        if self.ledger is None:
            return []
        # A read: abandoning it on a stop's deadline leaves nothing half done.
        recovery = await trio.to_thread.run_sync(self.ledger.recover, abandon_on_cancel=True)
        return [*recovery.pending, *recovery.interrupted, *recovery.outbox]

    async def _sweep_ledger(self) -> None:
        """Report every run the ledger still has unreported and nobody holds, once."""
        for row in await self._unreported():
            if row.run_id in self.held or row.run_id in self._swept:
                continue
            self._swept.add(row.run_id)
            held = await self._held_from(row)
            if held is None:
                continue
            log.warning("run %s was still unreported (%s) at the end of the drain; "
                        "reporting it now", row.run_id, row.state)
            self._hold(held)
            if row.state is RunState.FINISHED and row.outcome is not None:
                self._settle_soon(held, Outcome.from_json(row.outcome), recorded=True)
            elif row.state is RunState.ACCEPTED:
                self._settle_soon(held, Outcome.failure(NOT_STARTED, retryable=True))
            else:
                self._settle_soon(held, Outcome.failure(INTERRUPTED, retryable=True))

    async def _ledger_settled(self) -> bool:
        """After the sweep: False (logged) if a run is unreported and not even in the
        outbox; outbox rows left are logged, and are the next start's to report."""
        settled = True
        for row in await self._unreported():
            if row.state is RunState.FINISHED:
                log.warning("run %s could not be reported now; it stays in the ledger's "
                            "outbox and the next start reports it", row.run_id)
            else:
                log.error("run %s is still %s in the ledger and could not be reported; "
                          "the next start reports it (is the disk failing?)",
                          row.run_id, row.state)
                settled = False
        return settled

    # ------------------------------------------------------------------ link handler

    async def on_session(
        self, session: Session, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """For the life of one connection: the beacon's status and heartbeats.

        Reports started once status and the first heartbeat are out (§1).
        Cancelled when the connection drops; nothing to clean up.
        """
        await self.beacon.serve(session, task_status=task_status)

    async def on_message(self, session: Session, message: Message) -> None:
        """Handle one message; never raises for anything the server sends.

        Cancelled (the connection dropped): a delivery may be left recorded in the
        ledger but unacked; its redelivery is answered 200 "already accepted".
        """
        if isinstance(message, Delivery):
            await self._on_delivery(session, message)
        elif isinstance(message, Cancel):
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

    async def _on_delivery(self, session: Session, delivery: Delivery) -> None:
        now = time.time()
        verdict = intake.classify(
            delivery,
            secret=self.endpoints.secret,
            now=now,
            draining=self.draining,
            allow_unverified=self.options.allow_unverified,
            # No account can take it: the server had better send it elsewhere (§12).
            unavailable=all_limited_reason(self.book.earliest_reset(now))
            if not self.options.dry_run and self.book.all_limited(now) else None,
        )
        run = verdict.run
        if run is None:
            log.warning("delivery %s refused with %d: %s", intake.shown(delivery.id),
                        verdict.status, verdict.reason)
            await session.send(Ack(id=delivery.id, status=verdict.status, reason=verdict.reason))
            return
        if verdict.unverified:
            log.warning("accepted run %s without a valid signature (%s) because of "
                        "--allow-unverified", run.run_id, verdict.unverified)
        status, reason = await self._admit(run, verdict.body)
        await session.send(Ack(id=delivery.id, status=status, reason=reason))

    async def _admit(self, run: AgentRun, body: str) -> tuple[int, str]:
        if self.options.dry_run:
            if run.run_id in self._dry_seen:
                return intake.ACCEPTED, "already accepted"
            self._dry_seen.add(run.run_id)
            log.info("dry run: would run %s on %s: %r", run.run_id, run.lane, run.text[:80])
            return intake.ACCEPTED, "accepted (dry run)"
        if self.ledger is None:
            raise RuntimeError("a harness without a ledger can only admit runs in a dry run")
        if (
            run.run_id not in self.held
            and self.scheduler.statistics().queued >= intake.MAX_QUEUED_RUNS
        ):
            # A run already held is answered 200 below; only new work is refused.
            log.warning("refused run %s with 503: %d runs are already queued", run.run_id,
                        intake.MAX_QUEUED_RUNS)
            return intake.DRAINING, intake.QUEUE_FULL
        try:
            # Abandoning on a hung disk is safe: one transaction under the ledger's
            # lock (prohost.ledger); the delivery is then refused, and redelivered.
            admission = await self._bounded(
                self.ledger.admit, run.run_id, run.lane, body, time.time(),
                what=f"recording run {run.run_id} in the ledger",
            )
        except (LedgerError, OSError) as exc:
            log.error("could not record run %s in the ledger: %s", run.run_id, exc)
            return intake.DRAINING, "the agent could not record the run; try again later"
        if admission is Admission.REPORTED:
            return intake.IGNORED, "already reported"
        if admission is Admission.HELD:
            return intake.ACCEPTED, "already accepted"
        held = HeldRun(run=run)
        self._hold(held)
        if self.draining:
            # The first signal came while the ledger was being written: the run
            # is ours now, so report it as not started rather than lose it.
            self._settle_soon(held, Outcome.failure(NOT_STARTED, retryable=True))
            return intake.ACCEPTED, "accepted"
        try:
            self.scheduler.submit(run.run_id, run.lane, held)
        except QueueFullError as exc:
            # Intake answers 503 before this cap is reached, so this is a safety
            # net: the run is recorded, so it is reported rather than lost.
            log.error("%s", exc)
            self._settle_soon(held, Outcome.failure(QUEUE_FULL, retryable=True))
            return intake.ACCEPTED, "accepted"
        progress_log.info("accepted run %s on %s", run.run_id, run.lane)
        return intake.ACCEPTED, "accepted"

    # ------------------------------------------------------------------ cancel

    def cancel(self, run_id: str, reason: str, *, quiet: bool = False) -> None:
        """Stop a run and report it cancelled (§6). Unknown runs are ignored."""
        held = self.held.get(run_id)
        if held is None or held.state == "reporting" or held.stop_outcome is not None:
            (log.debug if quiet or held is not None else log.info)(
                "ignored a cancel for run %s: not running here", run_id
            )
            return
        outcome = Outcome.failure(f"cancelled: {reason}")
        log.info("cancelling run %s: %s", run_id, reason)
        if self.scheduler.remove(run_id) is not None:
            self._settle_soon(held, outcome)
            self._changed()
            return
        held.stop_outcome = outcome
        held.exec_scope.cancel()

    def forget(self, run_id: str) -> None:
        """The server no longer knows the run: stop it and never report it (§2)."""
        held = self.held.get(run_id)
        if held is None:
            return
        log.info("run %s is closed on the server; stopping it without a report", run_id)
        held.dropped = True
        held.life_scope.cancel()
        if self.scheduler.remove(run_id) is not None:
            self._running_nursery().start_soon(self._record_dropped, held)
            self._changed()

    # ------------------------------------------------------------------ one run

    async def _work(self, run_id: str, held: HeldRun) -> None:
        """The scheduler's work for one run: the runner executes and reports it.

        The run's slot goes back to the scheduler as soon as its outcome is durable;
        its lane only when this returns, after the report (§4). Cancelled: as
        :meth:`Runner.run`; the run is let go either way.
        """
        self._changed()
        try:
            await self._runner().run(
                held, release_slot=functools.partial(self._release_slot, run_id)
            )
        finally:
            self._release(held)

    def _release_slot(self, run_id: str) -> None:
        self.scheduler.release_slot(run_id)
        self._changed()

    def _settle_soon(self, held: HeldRun, outcome: Outcome, *, recorded: bool = False) -> None:
        """Report a run that will not (or did not, in this process) execute."""
        nursery = self._running_nursery()
        held.state = "reporting"
        nursery.start_soon(self._settle_alone, held, outcome, recorded)

    def _running_nursery(self) -> trio.Nursery:
        if self._nursery is None:
            raise RuntimeError("the harness is not running (Harness.run() has not started "
                               "or has returned): no task can be started for a run")
        return self._nursery

    async def _settle_alone(self, held: HeldRun, outcome: Outcome, recorded: bool) -> None:
        try:
            await self._runner().settle_only(held, outcome, recorded=recorded)
        finally:
            self._release(held)

    async def _record_dropped(self, held: HeldRun) -> None:
        try:
            await self._runner().record_dropped(held)
        finally:
            self._release(held)

    def _runner(self) -> Runner:
        # Only a harness with a ledger executes or reports anything (not a dry run).
        if self.runner is None:
            raise RuntimeError("a dry run (no ledger) cannot execute or report a run")
        return self.runner

    def _on_outcome(self, held: HeldRun, outcome: Outcome) -> None:
        """A run has its outcome and is about to be reported: books and logs."""
        run = held.run
        if outcome.ok:
            progress_log.info("✓ run %s finished", run.run_id)
        else:
            progress_log.info("✗ run %s failed: %s", run.run_id, outcome.error)
        if held.progress.model:
            self.model = held.progress.model
        self._finished.appendleft(FinishedRow(
            run_id=run.run_id, conversation=run.conversation_id, ok=outcome.ok,
            error=outcome.error,
            duration_s=None if outcome.duration_ms is None else outcome.duration_ms / 1000,
            finished_at=time.time(),
        ))
        self._changed()

    # ------------------------------------------------------------------ bookkeeping

    def _hold(self, held: HeldRun) -> None:
        self.held[held.run_id] = held
        self._changed()

    def _release(self, held: HeldRun) -> None:
        if self.held.get(held.run_id) is held:
            del self.held[held.run_id]
            self._changed()

    def _running(self) -> int:
        # Executing, or done and still being reported: both are waited for.
        stats = self.scheduler.statistics()
        return stats.running + stats.reporting

    def _changed(self) -> None:
        self.beacon.poke()
        self._state_changed.set()
        self._state_changed = trio.Event()

    async def wait_until(self, predicate: Callable[[Harness], bool]) -> None:
        """Return once ``predicate(self)`` holds, re-checked after every change of
        runs, connection or drain state. Cancelling it only stops the wait."""
        while not predicate(self):
            await self._state_changed.wait()

    def snapshot(self) -> Snapshot:
        """A frozen picture of this moment, for the panel and ``agent status``."""
        now = trio.current_time()
        link = self.link.statistics()
        connection: Connection
        if self.stopping:
            connection = "stopping"
        elif self.draining:
            connection = "draining"
        elif link.connected:
            connection = "connected"
        elif link.failures:
            connection = "reconnecting"
        else:
            connection = "connecting"
        stats = self.scheduler.statistics()
        rows = []
        for held in self.held.values():
            if held.state == "queued" and held.progress.waiting_until is None:
                continue
            started = held.started_at
            idle_left = None
            last = held.progress.last_output
            if held.state == "running" and last is not None and self.options.idle_timeout_s > 0:
                idle_left = max(0.0, last + self.options.idle_timeout_s - now)
            rows.append(RunRow(
                run_id=held.run_id, lane=held.run.lane, conversation=held.run.conversation_id,
                state=held.state,
                elapsed_s=None if started is None else max(0.0, time.time() - started),
                activity=held.beat().activity, idle_left_s=idle_left,
            ))
        return Snapshot(
            taken_at=time.time(),
            pid=os.getpid(),
            version=__version__,
            connection=connection,
            server=self.endpoints.ws_url,
            machine=self.options.machine,
            brain=self.brain.name,
            brain_version=self.brain_version,
            model=self.model,
            slots=stats.limit,
            slots_used=stats.running,
            queued=stats.queued,
            reconnect_in_s=None if link.reconnect_at is None
            else max(0.0, link.reconnect_at - now),
            last_error=link.last_error,
            heartbeat_age_s=None if self.beacon.last_heartbeat_at is None or not link.connected
            else now - self.beacon.last_heartbeat_at,
            runs=tuple(rows),
            finished=tuple(self._finished),
            accounts=tuple(self.account_rows()),
        )

    async def next_status_write(self) -> None:
        """Return after ``status.json`` is next written. Cancelling only stops the wait."""
        await self._status_written.wait()

    async def _keep_status_file(self) -> None:
        """Keep ``$PROHOST_HOME/status.json`` current: on every change, at most once a
        second, and every few seconds regardless (its age says the harness is alive).

        Cancelled: the file is removed (shielded, bounded), so ``agent status`` says
        plainly that no harness is running.
        """
        home = self.options.home
        try:
            while True:
                snapshot = self.snapshot()
                try:
                    await trio.to_thread.run_sync(write_snapshot, home, snapshot)
                except OSError as exc:
                    log.warning("could not write %s: %s", home / STATUS_FILE, exc)
                self._status_written.set()
                self._status_written = trio.Event()
                await trio.sleep(STATUS_FILE_MIN_INTERVAL_S)
                # Elapsed times move while runs execute; otherwise only changes matter.
                with trio.move_on_after(
                    STATUS_FILE_MIN_INTERVAL_S if snapshot.runs else REFRESH_S
                ):
                    await self._state_changed.wait()
        finally:
            with trio.move_on_after(2, shield=True):
                await trio.to_thread.run_sync(_remove_quietly, home / STATUS_FILE)

    def _status(self) -> Status:
        stats = self.scheduler.statistics()
        return Status(
            version=__version__,
            machine=self.options.machine,
            brain=self.brain.name,
            brain_version=self.brain_version,
            model=self.model,
            concurrency=self.options.concurrency,
            active=stats.running,
            queued=stats.queued,
            draining=self.draining,
            features=["cancel", "timeline"] if self.brain.streams else ["cancel"],
            accounts=self.account_rows(),
        )

    def account_rows(self) -> list[AccountRow]:
        """``status.accounts`` (§12), as of now."""
        return [AccountRow(**row) for row in self.book.snapshot(time.time())]

    async def _announce_resets(self, runner: Runner) -> None:
        """Announce each account whose limit's reset has come (status, panel), and
        wake queued runs waiting for it: the book changes by the clock alone.

        Cancelled: nothing to undo.
        """
        while True:
            reset = self.book.earliest_reset(time.time())
            with trio.move_on_after(math.inf if reset is None
                                    else max(0.0, reset - time.time()) + 0.01):
                await runner.book_changed.wait()
                continue
            # The reset passed: the book expires it on the next question, and the
            # next time every account is limited, --limit-wait counts afresh.
            runner.limit_wait_deadline()
            runner.book_changed.set()
            runner.book_changed = trio.Event()
            self._changed()

    # ------------------------------------------------------------------ recovery

    async def _recover(self) -> None:
        """Pick up where a previous process left off (§7).

        A drain that comes meanwhile (a signal while the ledger is read) turns the
        runs accepted before the restart into "not started" reports (§9) instead of
        queueing them. Cancelled: the runs not held yet stay in the ledger as they
        were, for the next start.
        """
        if self.ledger is None:
            return
        # Abandoning these on a hung disk is safe: reads and single transactions under
        # the ledger's lock, and /proc reads (prohost.ledger, prohost.blocking). A hung
        # read fails the start with the StepTimedOut; restart once the disk answers.
        recovery = await self._bounded(self.ledger.recover, what="reading the ledger at start")
        limits = await self._bounded(self.ledger.account_limits,
                                     what="reading the accounts' limits at start")
        now = time.time()
        for name, until in limits.items():
            self.book.restore(name, until, now)
            if until > now and name in {a.name for a in self.book.accounts}:
                log.warning("account %s is at its usage limit until %s (remembered from "
                            "before the restart)", name, iso_time(until))
        for row in recovery.interrupted:
            held = await self._held_from(row)
            if held is None:
                continue
            try:
                await self._bounded(self._kill_leftover, row,
                                    what=f"looking for run {row.run_id}'s leftover agent")
            except StepTimedOut as exc:
                log.warning("%s", exc)
            log.warning("run %s was running when the harness stopped; reporting it", row.run_id)
            self._hold(held)
            self._settle_soon(held, Outcome.failure(RESTARTED, retryable=True))
        for row in recovery.outbox:
            held = await self._held_from(row)
            if held is None or row.outcome is None:
                continue
            log.info("run %s finished before the restart; reporting it now", row.run_id)
            self._hold(held)
            self._settle_soon(held, Outcome.from_json(row.outcome), recorded=True)
        for row in recovery.pending:
            held = await self._held_from(row)
            if held is None:
                continue
            self._hold(held)
            if self.draining:
                log.info("run %s was accepted before the restart; not starting it, the "
                         "harness is draining", row.run_id)
                self._settle_soon(held, Outcome.failure(NOT_STARTED, retryable=True))
                continue
            log.info("run %s was accepted before the restart; queueing it again", row.run_id)
            try:
                self.scheduler.submit(row.run_id, held.run.lane, held)
            except QueueFullError:
                # Only if the ledger held more than the cap (an older version's rows):
                # the run is reported retryable rather than lost.
                self._settle_soon(held, Outcome.failure(QUEUE_FULL, retryable=True))
        pruned = await self._prune()
        if pruned:
            log.debug("pruned %d old ledger rows", pruned)

    async def _held_from(self, row: LedgerRow) -> HeldRun | None:
        try:
            return HeldRun(run=parse_body(row.body))
        except BodyError as exc:  # accepted by an older version that was less strict
            log.error("run %s in the ledger cannot be read (%s); closing it unreported",
                      row.run_id, exc)
            # Closed, so that it is not met again at every start.
            if self.ledger is None:
                return None
            await self._bounded(
                self.ledger.mark_reported, row.run_id, f"unreadable: {exc}", time.time(),
                what=f"closing unreadable run {row.run_id}",
            )
            return None

    @staticmethod
    def _kill_leftover(row: LedgerRow) -> None:
        """Blocking (it may read /proc or run ps): call it in a worker thread."""
        if row.pgid is None or not process_belongs_to_run(row.pgid, row.run_id):
            return
        log.warning("killing the agent of run %s left from the previous harness (group %d)",
                    row.run_id, row.pgid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(row.pgid, signal.SIGKILL)

    async def _probe_brain(self) -> None:
        """Ask the agent CLI its version once, for the status message (§5.7)."""
        command = self.brain.version_command()
        if command is None:
            return
        with trio.move_on_after(BRAIN_PROBE_TIMEOUT_S):
            try:
                result = await trio.run_process(
                    command, shell=True, capture_stdout=True, capture_stderr=True,
                    check=False, env=self.env, stdin=b"",
                )
            except OSError as exc:
                log.warning("could not ask %s its version: %s", self.brain.name, exc)
                return
            lines = result.stdout.decode("utf-8", "replace").strip().splitlines()
            if result.returncode == 0 and lines:
                self.brain_version = lines[0].strip()[:80]
                log.info("agent CLI: %s %s", self.brain.name, self.brain_version)
                self._changed()
            else:
                log.warning("`%s` failed (exit %s): is the agent CLI installed?", command,
                            result.returncode)

    async def _collect_worktrees_daily(self) -> None:
        """Once a day, :meth:`collect_worktrees`. Cancelled: an in-progress removal
        is finished (shielded inside ``collect_garbage``)."""
        while True:
            await trio.sleep(PRUNE_EVERY_S)
            await self.collect_worktrees()

    async def collect_worktrees(self, *, now: float | None = None) -> None:
        """Remove worktrees of lanes idle for 14 days (clean ones only), never a lane
        with a run in flight: a lane is held in the scheduler while its worktrees
        are removed, so a turn arriving meanwhile starts after, and prepares them
        afresh. Errors are logged. Cancelled: as :meth:`_collect_worktrees_daily`.
        """
        try:
            entries = await collect_garbage(
                self.options.home, older_than_s=WORKTREE_IDLE_S, dry_run=False, force=False,
                # Live, not a snapshot: GC asks again just before it removes anything.
                busy=lambda lane: any(h.run.lane == lane for h in self.held.values()),
                hold=self.scheduler.holding,
                now=now,
            )
        except OSError as exc:
            log.warning("could not collect old worktrees: %s", exc)
            return
        for entry in entries:
            (log.info if entry.action == "removed" else log.debug)(
                "worktrees of %s: %s (%s)", entry.lane, entry.action, entry.detail)

    async def _prune_daily(self) -> None:
        """Once a day, prune the ledger (§7; see :meth:`_prune`).

        Cancelled: between prunes, nothing to undo; a prune in progress finishes,
        within its bound.
        """
        while True:
            await trio.sleep(PRUNE_EVERY_S)
            await self._prune()

    async def _prune(self) -> int:
        """Empty and forget old reported runs (see Ledger.prune); how many rows changed.

        A failing or hung disk is logged, not raised: pruning can wait a day.
        Cancelled: as :meth:`prohost.blocking.Bounds.run`.
        """
        if self.ledger is None:
            return 0
        try:
            # Abandoning is safe: one transaction under the ledger's lock.
            return await self._bounded(self.ledger.prune, time.time(), PRUNE_AGE_S,
                                       what="pruning the ledger")
        except (LedgerError, OSError) as exc:
            log.warning("could not prune the ledger: %s", exc)
            return 0

    async def _bounded(self, fn: Callable[..., T], *args: object, what: str) -> T:
        """A blocking ledger or /proc call, bounded (and hurried by :meth:`stop`).

        Cancelled: as :meth:`prohost.blocking.Bounds.run`.
        """
        if self.runner is None:
            raise RuntimeError(f"harness bug: {what} without a ledger")
        return await self.runner.bounds.run(fn, *args, limit_s=LEDGER_STEP_TIMEOUT_S,
                                            what=what)


def _remove_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0
