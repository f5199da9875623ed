"""One run's middle through the production :class:`Runner`, without a server.

``solo_runner`` builds the real Runner over a real sqlite ledger in the test's
folder (its reporter is never asked to post: only :meth:`Runner.outcome_of` is
called, which ends before the ``finished`` step and the report). ``SoloRunner.outcome``
admits a run in that ledger, optionally gives its lane a saved session, and
returns the outcome the Runner would report — the real path from the account to
the outcome: ``started``, the checkouts, the prompt, the working folder, the MCP
folder and the attempts.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import httpx
import trio

from prohost.engine.accounts.book import DEFAULT_ACCOUNT, AccountBook
from prohost.engine.accounts.gate import AccountGate
from prohost.engine.agent.brains.base import Brain
from prohost.engine.agent.process import ProcessGroups
from prohost.engine.agent.reading import ToolEventSink
from prohost.engine.blocking import Bounds
from prohost.engine.ledger import Ledger
from prohost.engine.ledger.steps import LaneTurn, LedgerSteps
from prohost.engine.report.outbox import Outbox
from prohost.engine.report.reporter import Reporter
from prohost.engine.repos.worktrees import WorktreeManager
from prohost.engine.run.attempts import Attempts
from prohost.engine.run.confine import SANDBOX_OFF
from prohost.engine.run.execute import AgentSetup, ExecSpec
from prohost.engine.run.heldrun import HeldRun
from prohost.engine.run.runner import Runner
from prohost.engine.run.workspace import Workspaces
from prohost.wire.runs import AgentRun, Outcome

__all__ = ["SoloRunner", "solo_runner"]


@attrs.frozen
class SoloRunner:
    runner: Runner
    ledger: Ledger

    async def outcome(self, run: AgentRun, *, session_id: str | None = None,
                      held: HeldRun | None = None,
                      timeline: ToolEventSink | None = None) -> Outcome:
        """``run``'s outcome as the Runner makes it; ``session_id`` is the lane's
        saved session (resumed by the run); ``held`` the held run to use (so a test
        can read its progress)."""
        return (await self.turn(run, session_id=session_id, held=held,
                                timeline=timeline))[0]

    async def turn(self, run: AgentRun, *, session_id: str | None = None,
                   held: HeldRun | None = None, timeline: ToolEventSink | None = None
                   ) -> tuple[Outcome, LaneTurn | None]:
        """As :meth:`outcome`, with the lane's turn the Runner would save."""
        self.ledger.admit(run.run_id, run.lane, "{}", time.time())
        if session_id is not None:
            self.ledger.save_turn(run.lane, DEFAULT_ACCOUNT, session_id, time.time())
        return await self.runner.outcome_of(held if held is not None else HeldRun.of(run),
                                            timeline)


async def _no_limits(limits: dict[str, float]) -> None:
    return None


@asynccontextmanager
async def solo_runner(
    folder: Path, spec: ExecSpec, brain: Brain, *, groups: ProcessGroups | None = None,
    bounds: Bounds | None = None, env: Mapping[str, str] | None = None,
    worktrees: WorktreeManager | None = None, scratch_root: Path | None = None,
) -> AsyncIterator[SoloRunner]:
    """The production Runner for ``spec`` and ``brain``, its ledger in ``folder``."""
    await trio.Path(folder).mkdir(parents=True, exist_ok=True)
    bounds = bounds if bounds is not None else Bounds()
    with Ledger.open(folder / "solo-ledger.sqlite3") as ledger:
        steps = LedgerSteps(ledger, bounds)
        async with httpx.AsyncHTTPTransport() as client:
            # Never posts: outcome_of ends before the report.
            reporter = Reporter(client, "http://127.0.0.1:9", "solo-token")
            book = AccountBook()
            setup = AgentSetup(brain, spec, groups if groups is not None else ProcessGroups(),
                               bounds)
            runner = Runner(
                steps=steps, outbox=Outbox(reporter, steps),
                workspaces=Workspaces(
                    setup=setup, env=dict(env) if env is not None else dict(os.environ),
                    worktrees=worktrees if worktrees is not None and worktrees.enabled
                    else None,
                    scratch_root=scratch_root if scratch_root is not None else folder / "runs",
                    sandbox=SANDBOX_OFF, agent=brain.folders_owner),
                attempts=Attempts(setup=setup, steps=steps,
                                  gate=AccountGate(book, limit_wait_s=0, clock=time.time,
                                                   on_change=lambda: None,
                                                   save_limits=_no_limits),
                                  clock=time.time, on_change=lambda: None),
                on_change=lambda: None, on_outcome=lambda run_id, lane, progress, outcome: None,
            )
            yield SoloRunner(runner, ledger)

