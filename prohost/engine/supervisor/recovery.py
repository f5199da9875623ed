"""Restart recovery (§7) and the end-of-drain sweep: the ledger's unreported rows
become held runs again, reported or queued as the protocol says. A redelivered run
that nothing holds is taken on here too (:meth:`Recovery.resume_unheld`).

:class:`Recovery` is handed the ledger steps, the table of held runs, the run queue,
and the account book (limits remembered from before a
restart); it logs under ``prohost.harness``, the name users already filter on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from prohost.engine import lognames
from prohost.engine.accounts.book import AccountBook
from prohost.engine.accounts.spend import DailySpend, day_start
from prohost.engine.agent.procinfo import groups_of_run, process_belongs_to_run
from prohost.engine.blocking import Bounds, StepTimedOut
from prohost.engine.ledger import LedgerError, LedgerRow, RunState
from prohost.engine.ledger.interfaces import RecoverySteps
from prohost.engine.ledger.steps import LEDGER_STEP_TIMEOUT_S
from prohost.engine.report.outbox import Outbox, saved_outcome
from prohost.engine.run.heldrun import HeldRun, Interrupted
from prohost.engine.supervisor.held import HeldRuns
from prohost.engine.supervisor.requests import LOCAL_CANCEL_REASON, answered, pending_cancels
from prohost.engine.supervisor.runqueue import RunQueue
from prohost.engine.supervisor.upkeep import prune
from prohost.engine.view.statustext import human_ago
from prohost.wire.outcomes import INTERRUPTED, RESTARTED, cancelled, iso_time
from prohost.wire.runs import BodyError, Outcome, parse_body

log = logging.getLogger(lognames.HARNESS)


class Recovery:
    """Takes on the runs the ledger has and nothing here holds: at start, at a
    redelivery, and once a drain has nothing left (see the module docstring)."""

    def __init__(self, *, steps: RecoverySteps, runs: HeldRuns, queue: RunQueue,
                 book: AccountBook, outbox: Outbox | None = None,
                 clock: Callable[[], float] = time.time,
                 spend: DailySpend | None = None, bounds: Bounds | None = None,
                 home: Path | None = None) -> None:
        self.steps = steps
        #: Where ``prohost agent cancel`` leaves its requests (None: none are read).
        self.home = home
        #: The harness's bounds (hurried by the second signal), for the /proc look
        #: for a leftover agent.
        self.bounds = bounds if bounds is not None else Bounds()
        self.runs = runs
        self.queue = queue
        self.book = book
        #: Reports waiting past their window (§7): not taken on twice.
        self.outbox = outbox
        self.clock = clock
        #: Today's spend per account, counted again from the ledger at start.
        self.spend = spend
        #: Runs the end-of-drain sweep already reported once (never twice).
        self.swept: set[str] = set()

    async def recover(self) -> None:
        """Pick up where a previous process left off (§7).

        A drain that comes meanwhile (a signal while the ledger is read) turns the
        runs accepted before the restart into "not started" reports (§9) instead of
        queueing them. A run ``prohost agent cancel`` asked to cancel before the
        previous process could obey (a ``kill -9`` in between) is reported cancelled
        (§6), never "restarted" or queued. Cancelled: the runs not held yet stay in
        the ledger as they were, for the next start.
        """
        steps = self.steps
        # Abandoning these on a hung disk is safe: reads and single transactions
        # under the ledger's lock, and /proc reads (prohost.engine.ledger,
        # prohost.engine.blocking). A hung read fails the start with the
        # StepTimedOut; restart once the disk answers.
        recovery = await steps.unreported("reading the ledger at start")
        asked = await self._asked_cancels()
        interrupted = [await self._keep_cancel(row) if row.run_id in asked else row
                       for row in recovery.interrupted]
        pending = [await self._keep_cancel(row) if row.run_id in asked else row
                   for row in recovery.pending]
        limits = await steps.account_limits()
        now = self.clock()
        if self.spend is not None:
            finished = await steps.finished_since(day_start(now))
            self.spend.restore(spent(finished), now)
        for name, until in limits.items():
            self.book.restore(name, until, now)
            if until > now and name in {a.name for a in self.book.accounts}:
                log.warning("account %s is at its usage limit until %s (remembered from "
                            "before the restart)", name, iso_time(until))
        for row in interrupted:
            held = await self.held_from(row)
            if held is None:
                continue
            try:
                await self.bounds.run(kill_leftover, row, limit_s=LEDGER_STEP_TIMEOUT_S,
                                      what=f"looking for run {row.run_id}'s leftover agent")
            except StepTimedOut as exc:
                log.warning("%s", exc)
            # Its agent's usage was never read: the lane's next turn, whose CLI may
            # count it in its running totals (Codex), says so (§7).
            await self.steps.interrupted_turn(row.lane)
            log.warning("run %s was %s when the harness stopped; reporting it", row.run_id,
                        "being cancelled" if row.outcome is not None else "running")
            self.carry_on(held, row, interrupted=RESTARTED)
        for row in recovery.outbox:
            held = await self.held_from(row)
            if held is None or row.outcome is None:
                continue
            log.info("run %s finished before the restart; reporting it now", row.run_id)
            self.carry_on(held, row)
        for row in pending:
            held = await self.held_from(row)
            if held is None:
                continue
            log.info("run %s was accepted before the restart; %s", row.run_id,
                     "not starting it, the harness is draining" if self.queue.draining
                     else "queueing it again")
            self.carry_on(held, row)
        pruned = await prune(steps)
        if pruned:
            log.debug("pruned %d old ledger rows", pruned)

    async def _asked_cancels(self) -> set[str]:
        """The runs ``prohost agent cancel`` asked to cancel and no harness obeyed yet
        (a ``kill -9`` came between the request's file and the harness reading it).

        Read before the interrupted runs are reported: §6 makes a cancel final once
        the harness holds it, and a running run reported "restarted" (retryable)
        would be run again by the server. Each request is removed once its cancel is
        kept in the ledger (:meth:`_keep_cancel`); one for a run recovery does not
        report is left to the harness's reading of requests once it is up
        (:func:`~prohost.engine.supervisor.requests.obey_requests`). A folder that
        cannot be read is logged; the runs are then reported as the ledger has them.
        Cancelled: as :meth:`prohost.engine.blocking.Bounds.file_step` (a read).
        """
        if self.home is None:
            return set()
        try:
            return set(await self.bounds.file_step(pending_cancels, self.home,
                                                   what="reading the cancel requests"))
        except OSError as exc:
            log.warning("could not read the cancel requests in %s at start (%s); "
                        "`prohost agent cancel` them again once it is up", self.home, exc)
            return set()

    async def _keep_cancel(self, row: LedgerRow) -> LedgerRow:
        """``row`` with the cancel a request asked for as its outcome, kept in the
        ledger first (as a server's cancel is, §6) so that another ``kill -9``
        before the report changes nothing. A row that has a cancel already keeps
        its own; a ledger that cannot take it is logged and the run is reported
        cancelled all the same. Cancelled: as :meth:`LedgerSteps.cancelled` (the
        row keeps its state; the request stays for the next start)."""
        if row.outcome is not None:
            return row
        outcome = Outcome.failure(cancelled(LOCAL_CANCEL_REASON)).to_json()
        try:
            await self.steps.cancelled(row.run_id, outcome)
        except Exception as exc:
            log.error("run %s: the cancel asked on this machine could not be kept in the "
                      "ledger (%s); reporting it cancelled all the same", row.run_id, exc)
            return attrs.evolve(row, outcome=outcome)
        if self.home is not None:
            # Kept in the ledger: the request is answered, before the run's report.
            try:
                await self.bounds.file_step(answered, self.home, row.run_id,
                                            what="removing a request")
            except OSError as exc:
                log.warning("could not remove the request to cancel %s: %s", row.run_id, exc)
        return attrs.evolve(row, outcome=outcome)

    async def held_from(self, row: LedgerRow) -> HeldRun | None:
        """The run of a ledger row, held again; ``None`` (the row closed, logged) when
        its body cannot be read any more.

        Cancelled: as :meth:`prohost.engine.blocking.Bounds.run` (closing the row).
        """
        try:
            return HeldRun.of(parse_body(row.body))
        except BodyError as exc:  # accepted by an older version that was less strict
            await self._close_unreadable(row.run_id, exc)
            return None

    async def _close_unreadable(self, run_id: str, exc: BodyError) -> None:
        """Close a row whose body cannot be parsed, so that it is not met again at
        every start. Cancelled: as :meth:`prohost.engine.blocking.Bounds.run`."""
        log.error("run %s in the ledger cannot be read (%s); closing it unreported",
                  run_id, exc)
        await self.steps.close_unreadable(run_id, str(exc))

    def carry_on(self, held: HeldRun, row: LedgerRow, *,
                 interrupted: str = INTERRUPTED) -> None:
        """Hold a ledger row's run again and take it on from where the ledger has it:
        a saved outcome is reported as it is, an accepted run is queued (or, during
        a drain, reported not started), a run that had started is reported with
        ``interrupted`` (retryable), since nothing in this process is running it, and
        one whose cancel the ledger kept is reported cancelled (§6); either of
        those two carries what the run changed and how long it ran
        (:class:`~prohost.engine.run.heldrun.Interrupted`). A
        saved outcome that cannot be read back is reported as
        :data:`~prohost.wire.outcomes.UNREADABLE_OUTCOME` (retryable)."""
        self.runs.hold(held)
        if row.state is RunState.STARTED:
            # Reported with what it changed since it began, and for how long (§7).
            held.interrupted = Interrupted(row.started_at, self.clock(), row.start_state)
        if row.state is RunState.FINISHED and row.outcome is not None:
            self.queue.settle(held, saved_outcome(row.run_id, row.outcome), recorded=True,
                        finished_at=row.finished_at)
        elif row.outcome is not None:
            # A cancel the ledger kept before the agent was stopped (§6): final,
            # whatever ended the process since; never queued or run again.
            self.queue.settle(held, saved_outcome(row.run_id, row.outcome))
        elif row.state is not RunState.ACCEPTED:
            self.queue.settle(held, Outcome.failure(interrupted, retryable=True))
        else:
            self.queue.put(held, row.body)

    async def resume_unheld(self, run_id: str) -> None:
        """Take on a run the ledger has unreported while nothing in this process
        holds it.

        That happens when a delivery's ledger write went through but its ack did not
        (the connection dropped, or the write outlived its bound), or when a report
        failed unexpectedly: left alone, the run would wait for the next start or
        the end of a drain. Its redelivery picks it up now instead (:meth:`carry_on`).

        Cancelled: as :meth:`prohost.engine.blocking.Bounds.run`; the run stays in
        the ledger, for the next redelivery or start.
        """
        if self.outbox is not None and run_id in self.outbox:
            # Its report waits for the server, which is evidently answering: try it now.
            self.outbox.poke()
            return
        row = await self.steps.lookup(run_id)
        if row is None or row.state is RunState.REPORTED or run_id in self.runs:
            return
        held = await self.held_from(row)
        if held is None or run_id in self.runs:
            return
        log.warning("run %s was in the ledger (%s) but nothing here was working on it; "
                    "taking it on again", run_id, row.state.value)
        self.carry_on(held, row)

    async def unreported(self) -> list[LedgerRow] | None:
        """Every ledger row not reported yet: pending, interrupted, then the outbox;
        ``None`` (logged) when the ledger cannot be read, within its bound.

        Cancelled: as :meth:`LedgerSteps.unreported` (a read: nothing is left half done).
        """
        try:
            recovery = await self.steps.unreported("reading the ledger's unreported runs")
        except (LedgerError, OSError) as exc:  # StepTimedOut (a hung disk) is an OSError
            log.error("could not read the ledger's unreported runs: %s; the next start "
                      "reports them", exc)
            return None
        return [*recovery.pending, *recovery.interrupted, *recovery.outbox]

    async def sweep_ledger(self) -> None:
        """Report every run the ledger still has unreported and nobody holds, once.

        Cancelled: the runs not held yet stay in the ledger, for the next start.
        """
        waiting = self.outbox if self.outbox is not None else ()
        for row in await self.unreported() or ():
            if row.run_id in self.runs or row.run_id in self.swept or row.run_id in waiting:
                continue
            self.swept.add(row.run_id)
            held = await self.held_from(row)
            if held is None:
                continue
            log.warning("run %s was still unreported (%s) at the end of the drain; "
                        "reporting it now", row.run_id, row.state)
            self.carry_on(held, row)

    async def ledger_settled(self) -> bool:
        """After the sweep: False (logged) if a run is unreported and not even in the
        outbox, or the ledger cannot be read; outbox rows left are logged, and are
        the next start's to report.

        Cancelled: the read is abandoned (it changes nothing), nothing is logged.
        """
        rows = await self.unreported()
        if rows is None:
            return False
        settled = True
        waiting = []
        for row in rows:
            if row.state is RunState.FINISHED:
                waiting.append(row.finished_at or row.accepted_at)
                log.warning("run %s could not be reported now; it stays in the ledger's "
                            "outbox and the next start reports it", row.run_id)
            else:
                log.error("run %s is still %s in the ledger and could not be reported; "
                          "the next start reports it (is the disk failing?)",
                          row.run_id, row.state)
                settled = False
        if waiting:
            # Not a failure of this harness: the outcomes are safe, the server is not
            # taking them; the exit stays 0 (§9) and the next start posts them.
            log.warning("%d report(s) wait in the ledger's outbox for the server (the "
                        "oldest run finished %s ago); the next start posts them",
                        len(waiting), human_ago(time.time() - min(waiting)))
        return settled


def spent(finished: list[tuple[float, str]]) -> list[tuple[str | None, Any, float]]:
    """``(account, usage, finished_at)`` of the ledger's finished runs whose agent ran
    (an outcome that names its account); an outcome that cannot be read is skipped."""
    found: list[tuple[str | None, Any, float]] = []
    for at, text in finished:
        try:
            data = json.loads(text)
        except ValueError:
            continue
        if isinstance(data, dict) and isinstance(data.get("account"), str):
            found.append((data["account"], data.get("usage"), at))
    return found


def kill_leftover(row: LedgerRow) -> None:
    """Kill the agent a previous harness left running for ``row``'s run, if any.

    By the group the ledger recorded, when it still is the run's agent, and always
    also by the run's marker in the agents' environment
    (:func:`prohost.engine.agent.procinfo.groups_of_run`): the recorded group is
    only the last one committed. A harness that died between an agent's spawn and
    the commit of its group left either no group or an earlier attempt's (dead, or
    reused by another process) while a later attempt's agent (a fail-over to another
    account, a fresh-session retry) lives on; reported "restarted" and retried by
    the server, the run would then run twice at once.

    Why the durable ``record_pgid`` step stays (issue 37 point 10, decided): the
    search below finds every group the recorded one would, on Linux (``/proc``) and
    on macOS (``ps``) alike, so the step earns no recovery there but one: the
    recorded group's members are read again while one is caught inside ``execve``
    (an empty environment, :func:`process_belongs_to_run`), where the search reads
    each process once. It is kept because docs/protocol.md §7 makes it normative
    ("recorded durably ... so that a restart can always find it"); it does not save
    the search's cost (one scan per interrupted run, at start only; the search is
    never skipped, see above). Dropping it would need §7 changed first.

    Blocking (it may read /proc or run ps): call it in a worker thread.
    """
    groups = []
    if row.pgid is not None and process_belongs_to_run(row.pgid, row.run_id):
        groups.append(row.pgid)
    # Searched even when the recorded group is live: an attempt's agent outlives
    # the group commit that would have named it, and searching costs one /proc
    # scan per interrupted run, at start only.
    groups += [pgid for pgid in groups_of_run(row.run_id) if pgid not in groups]
    for pgid in groups:
        log.warning("killing the agent of run %s left from the previous harness (group %d)",
                    row.run_id, pgid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
