"""A run's attempts: which account it starts on, each attempt on an account in the
run's workspace, the budget across them, and the fail-over to the next account when
one ends at its usage limit (§12).

:class:`Attempts` is the harness's, one for every run. The run's usage is counted by
its brain's meter (:mod:`prohost.engine.agent.meter`): the runner never asks which
brain it runs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import trio

from prohost.engine.accounts.book import Account, AccountBook
from prohost.engine.accounts.gate import AccountGate
from prohost.engine.agent.meter import UsageMeter, meter_for
from prohost.engine.agent.process import AgentWatch
from prohost.engine.agent.reading import ToolEventSink
from prohost.engine.ledger import LedgerError
from prohost.engine.ledger.interfaces import AttemptSteps
from prohost.engine.run.ending import Ending, Tally
from prohost.engine.run.execute import (
    AgentSetup,
    Attempt,
    AttemptResult,
    execute,
    left_of,
)
from prohost.engine.run.heldrun import HeldRun
from prohost.engine.run.workspace import AttemptNotReady, Ended, Workspace
from prohost.wire.outcomes import budget_reached
from prohost.wire.runs import Outcome
from prohost.wire.usage import Usage

log = logging.getLogger("prohost.runner")

__all__ = ["Attempts"]


class Attempts:
    """Runs' attempts (see the module docstring), handed their parts by the
    composition root: how agents start (``setup``), the ledger steps, the account
    gate, a clock (epoch s, for the book's reset times) and what to tell of a change."""

    def __init__(self, *, setup: AgentSetup, steps: AttemptSteps, gate: AccountGate,
                 clock: Callable[[], float], on_change: Callable[[], None]) -> None:
        self.setup = setup
        self.steps = steps
        #: Which account each run starts on, and the wait while none can (§12).
        self.gate = gate
        self.clock = clock
        self._on_change = on_change
        #: What the attempts spent, as the brain's CLI lets it be counted (§7).
        self.meter: UsageMeter = meter_for(setup.brain, self._totals_of, setup.bounds)

    @property
    def book(self) -> AccountBook:
        """The agent accounts and their limits (docs/protocol.md §12), the gate's."""
        return self.gate.book

    async def account_for(self, held: HeldRun) -> Account | Outcome:
        """The account ``held`` starts on (the lane's while it is usable), or the
        outcome of a run no account took (the wait while every account is limited,
        §12, or a drain). Cancelled: the wait ends, nothing to undo."""
        lane_account = None
        if len(self.book.accounts) > 1:
            # A read under the ledger's lock: abandoning it on a hung disk is safe.
            lane_account = await self.steps.lane_account(held.run.lane)
        return await self.gate.wait_for_account(held.run_id, held.progress, lane_account)

    def started(self, account: Account) -> None:
        """A run started on ``account`` (the book's least-recently-started order)."""
        self.book.started(account.name, self.clock())

    async def run(self, held: HeldRun, workspace: Workspace, account: Account,
                  session: str | None, tally: Tally, timeline: ToolEventSink | None,
                  deadline: float, ended: Ended) -> Ending:
        """The run's attempts on ``account`` (resuming ``session``) and, while each
        ends at its account's usage limit, on the next account the book offers
        (fresh session there; none left: wait as a queued run would, within
        ``deadline``). ``ended`` makes the run's ending (with its duration).

        Raises when the agent's process group cannot be written (killing its group):
        the runner turns that into a retryable internal error. Cancelled: the running
        agent's group is stopped (shielded, bounded) and the attempt's places taken
        down before the cancellation propagates.
        """
        run, progress, setup = held.run, held.progress, self.setup
        checkouts = workspace.checkouts
        # Durable, and waited for before the agent's output is: a restart after a
        # kill -9 finds and kills this group only if it was written (§7). Raising
        # (the write failed or outlived its bound) makes the attempt kill the
        # group, and the run is reported as an internal error: a step that cannot
        # be written is never skipped. With the checkouts' start state: a restart
        # says what the run changed (§7).
        start_state = checkouts.start_state()

        async def on_spawn(agent: AgentWatch) -> None:
            # A cancel kept since the last agent exited stops this one; from this
            # one's exit (its watch's leader_exited) a cancel waits for our word (§6).
            held.next_agent(agent)
            await self.steps.record_pgid(run.run_id, agent.pgid, start_state=start_state)

        tried: set[str] = set()
        while True:
            progress.account = account.name
            try:
                place = await workspace.open_attempt(account, session, len(tried), deadline)
            except AttemptNotReady as exc:
                # After a fail-over the session is the new account's own, untouched:
                # kept, so that the lane's turn does not forget it (§12).
                return ended(exc.outcome, changes=await checkouts.changes(),
                             ran=bool(tried), session_id=session if tried else None,
                             account=progress.account, totals=tally.totals)
            before = await self.meter.before(run.run_id, session, place.account_env, tally)
            # §12: the budget caps the run, all its attempts together; each attempt
            # is a new CLI process counting from zero, so it is given what the
            # earlier ones left. The budget is the one the CLI obeys: --max-cost's,
            # or the user's own --max-budget-usd in --exec.
            budget = left_of(setup.brain.budget_in_force(), tally.spent)
            try:
                result = await execute(
                    Attempt(run, workspace.prompt, dict(place.env), session, deadline,
                            place.wiring, before, max_cost_usd=budget, cwd=place.cwd,
                            confinement=None if place.confined is None
                            else place.confined.confinement),
                    setup, progress, on_spawn, timeline)
            finally:
                await workspace.close_attempt(place)
            tally.spent += result.spent
            tally.totals = result.session_totals
            if tally.totals is None and result.started and result.session_id is not None:
                share = await self.meter.unreported(run.run_id, result.session_id, tally)
                if share is not None:
                    tally.spent += share
            await self.gate.learned(account, result.limit)
            outcome, limited = result.outcome, result.ended_by_limit
            following = None
            if result.reached_budget:
                outcome = self._over_budget(tally)
            elif limited and left_of(setup.brain.budget_in_force(), tally.spent) == 0:
                # Nothing left for another account: the run ends at its budget (not
                # retryable: it would spend as much again).
                outcome, limited = self._over_budget(tally), False
            else:
                if result.ended_by_limit:
                    # Another agent may follow: a cancel kept meanwhile stops the run
                    # here, on this account, before another is chosen.
                    held.next_agent()
                    await trio.lowlevel.checkpoint_if_cancelled()
                following = await self._next_account(held, account, result, tried,
                                                     deadline)
            if following is None:
                # The agent has ended with its outcome: a cancel or a stop that comes
                # while its changes are read changes nothing (§6).
                held.agent_ended = True
                return ended(outcome, changes=await checkouts.changes(),
                             ran=True, session_id=result.session_id,
                             account=account.name, totals=tally.totals, limited=limited,
                             confined=(place.confined is not None
                                       and place.confined.confinement.confined)
                             if result.started else None)
            account, session = following

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
