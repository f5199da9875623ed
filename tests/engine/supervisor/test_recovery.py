"""Restart recovery and the end-of-drain sweep (prohost.engine.supervisor.recovery,
§7, §9) built from only the parts they use: a real sqlite ledger in ``tmp_path``
with its real steps, a real scheduler (not running: a queued run stays queued), run
queue, held-runs table and account book. The one stand-in is ``settle``, which
records what would be reported.

tests/process/test_restart.py and tests/engine/supervisor/test_recovery_during_a_drain.py check
the same through a harness; these pin each rule to this module.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from prohost.engine.accounts.book import Account, AccountBook
from prohost.engine.ledger import Ledger, LedgerError, RunState
from prohost.engine.ledger.steps import LedgerSteps
from prohost.engine.run.heldrun import HeldRun
from prohost.engine.run.queued_bodies import QueuedBodies
from prohost.engine.supervisor.held import HeldRuns
from prohost.engine.supervisor.recovery import Recovery
from prohost.engine.supervisor.runqueue import RunQueue
from prohost.wire.outcomes import NOT_STARTED, RESTARTED
from prohost.wire.runs import Outcome
from tests.kits.lanes import SettleLog

pytestmark = pytest.mark.protocol("§7")

#: What the scheduler records of a settled run: run id, outcome, recorded, finished_at.
Settled = tuple[str, Outcome, bool, float | None]

NOW = 1_800_000_000.0
DONE = Outcome(ok=True, reply="the answer", account="default")
#: The started run's id: recovery kills whatever process carries it, so it is unique.
STA = f"sta-{uuid.uuid4().hex}"


@attrs.define
class Parts:
    recovery: Recovery
    ledger: Ledger
    runs: HeldRuns
    queue: RunQueue
    scheduler: SettleLog
    book: AccountBook

    @property
    def settled(self) -> list[Settled]:
        """The runs reported without executing, in order."""
        return self.scheduler.settled


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    with Ledger.open(tmp_path / "ledger.sqlite3") as opened:
        yield opened


def build(ledger: Ledger, *, steps: LedgerSteps | None = None) -> Parts:
    """Recovery over real parts, with a clock fixed at :data:`NOW`."""
    scheduler = SettleLog()
    runs = HeldRuns(lambda: None)
    queue = RunQueue(scheduler, QueuedBodies(), lambda: None)
    book = AccountBook([Account("a", Path("/a")), Account("b", Path("/b"))])
    recovery = Recovery(steps=steps or LedgerSteps(ledger), runs=runs, queue=queue,
                        book=book, clock=lambda: NOW)
    return Parts(recovery, ledger, runs, queue, scheduler, book)


def body_of(run_id: str) -> str:
    return json.dumps({"run_id": run_id, "conversation_id": None, "text": "hello",
                       "completion_path": f"/v1/agent/runs/{run_id}/complete"})


def row(ledger: Ledger, run_id: str, state: RunState, *, body: str | None = None) -> None:
    """A row left in ``state`` by a previous process."""
    ledger.admit(run_id, f"run:{run_id}", body or body_of(run_id), NOW - 60)
    if state is RunState.ACCEPTED:
        return
    ledger.mark_started(run_id, NOW - 50)
    if state is RunState.FINISHED:
        ledger.mark_finished(run_id, DONE.to_json(), NOW - 40)
    elif state is RunState.REPORTED:
        ledger.mark_reported(run_id, "posted", NOW - 30)


def restarted(run_id: str) -> Settled:
    return (run_id, Outcome.failure(RESTARTED, retryable=True), False, None)


async def test_recover_queues_accepted_reports_started_and_posts_finished(
    ledger: Ledger,
) -> None:
    for run_id, state in [("acc", RunState.ACCEPTED), (STA, RunState.STARTED),
                          ("fin", RunState.FINISHED), ("rep", RunState.REPORTED)]:
        row(ledger, run_id, state)
    parts = build(ledger)
    await parts.recovery.recover()
    assert sorted(parts.runs) == ["acc", "fin", STA]
    assert "acc" in parts.scheduler and parts.queue.queued() == 1
    assert parts.settled == [restarted(STA), ("fin", DONE, True, NOW - 40)]


@pytest.mark.protocol("§9")
async def test_recover_while_draining_reports_accepted_runs_not_started(
    ledger: Ledger,
) -> None:
    row(ledger, "acc", RunState.ACCEPTED)
    row(ledger, STA, RunState.STARTED)
    parts = build(ledger)
    parts.queue.draining = True
    await parts.recovery.recover()
    assert parts.queue.queued() == 0 and sorted(parts.runs) == ["acc", STA]
    assert parts.settled == [restarted(STA),
                             ("acc", Outcome.failure(NOT_STARTED, retryable=True), False, None)]


async def test_recover_closes_a_row_whose_body_cannot_be_read(ledger: Ledger) -> None:
    # Accepted by a less strict version: no completion_path, which parse_body requires.
    row(ledger, "old", RunState.ACCEPTED, body=json.dumps({"run_id": "old", "text": "hi"}))
    parts = build(ledger)
    await parts.recovery.recover()
    closed = ledger.get("old")
    assert closed is not None and closed.state is RunState.REPORTED
    assert closed.settlement is not None and "completion_path" in closed.settlement
    assert len(parts.runs) == 0 and parts.settled == [] and parts.queue.queued() == 0
    assert ledger.recover().pending == []  # not met again at the next start


@pytest.mark.protocol("§12")
async def test_recover_restores_the_account_limits_the_ledger_remembers(
    ledger: Ledger,
) -> None:
    ledger.save_account_limits({"a": NOW + 600, "b": NOW + 3600, "gone": NOW + 60})
    parts = build(ledger)
    assert not parts.book.all_limited(NOW)
    await parts.recovery.recover()
    assert parts.book.all_limited(NOW)
    assert parts.book.earliest_reset(NOW) == NOW + 600
    assert parts.book.limits(NOW) == {"a": NOW + 600, "b": NOW + 3600}


@asynccontextmanager
async def stand_in_agent(run_id: str) -> AsyncIterator[trio.Process]:
    """A process in a group of its own, started with ``PROHOST_RUN_ID=<run_id>`` as
    an agent is, yielded once it runs (its environment is readable); it waits for
    stdin to close, then ends by itself with 0. Killed on the way out if alive."""
    code = "import sys; print('ready', flush=True); sys.stdin.read()"
    agent = await trio.lowlevel.open_process(
        [sys.executable, "-c", code], start_new_session=True,
        env={**os.environ, "PROHOST_RUN_ID": run_id},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert agent.stdin is not None and agent.stdout is not None
    try:
        line = b""
        while not line.endswith(b"\n"):
            chunk = await agent.stdout.receive_some()
            assert chunk, "the stand-in agent ended before it was ready"
            line += chunk
        assert line == b"ready\n"
        yield agent
    finally:
        with trio.CancelScope(shield=True):
            if agent.returncode is None:
                agent.kill()
                await agent.wait()
            await agent.stdin.aclose()
            await agent.stdout.aclose()


async def ended_by_itself(agent: trio.Process) -> int:
    """Close ``agent``'s stdin and return its exit status: 0 if it was alive until
    now, ``-SIGKILL`` if recovery killed it."""
    assert agent.stdin is not None
    await agent.stdin.aclose()
    return await agent.wait()


@pytest.mark.parametrize("recorded_group", ["its own", "none"])
async def test_recover_kills_the_agent_a_previous_harness_left_running(
    ledger: Ledger, recorded_group: str,
) -> None:
    async with stand_in_agent(STA) as agent:
        row(ledger, STA, RunState.STARTED)
        if recorded_group == "its own":
            ledger.record_pgid(STA, agent.pid)
        parts = build(ledger)
        await parts.recovery.recover()
        assert await ended_by_itself(agent) == -signal.SIGKILL
        assert parts.settled == [restarted(STA)]


async def test_recover_kills_a_later_attempt_whose_group_was_not_recorded(
    ledger: Ledger,
) -> None:
    # Issue 27: a fail-over or fresh-session retry spawned a second agent, and the
    # harness died before its group was committed: the ledger still names the first
    # attempt's group, long gone.
    first = await trio.lowlevel.open_process([sys.executable, "-c", "pass"],
                                             start_new_session=True)
    assert await first.wait() == 0  # reaped: its group is gone
    async with stand_in_agent(STA) as second:
        row(ledger, STA, RunState.STARTED)
        ledger.record_pgid(STA, first.pid)
        parts = build(ledger)
        await parts.recovery.recover()
        assert await ended_by_itself(second) == -signal.SIGKILL
        assert parts.settled == [restarted(STA)]


async def test_recover_kills_the_run_s_agent_not_the_one_that_reused_its_group(
    ledger: Ledger,
) -> None:
    # The recorded group's number now belongs to another run's live agent: that one
    # is left alone, and the run's own agent, in a group never recorded, is found.
    other = f"other-{uuid.uuid4().hex}"
    async with stand_in_agent(other) as reused, stand_in_agent(STA) as agent:
        row(ledger, STA, RunState.STARTED)
        ledger.record_pgid(STA, reused.pid)
        parts = build(ledger)
        await parts.recovery.recover()
        assert await ended_by_itself(agent) == -signal.SIGKILL
        assert await ended_by_itself(reused) == 0
        assert parts.settled == [restarted(STA)]


async def test_resume_unheld_takes_on_an_accepted_row_and_leaves_a_reported_one(
    ledger: Ledger,
) -> None:
    row(ledger, "lost_ack", RunState.ACCEPTED)
    row(ledger, "done", RunState.REPORTED)
    parts = build(ledger)
    await parts.recovery.resume_unheld("lost_ack")
    await parts.recovery.resume_unheld("lost_ack")  # held now: not queued twice
    await parts.recovery.resume_unheld("done")
    await parts.recovery.resume_unheld("unknown")
    assert list(parts.runs) == ["lost_ack"] and "lost_ack" in parts.scheduler
    assert parts.queue.queued() == 1 and parts.settled == []


@pytest.mark.protocol("§9")
async def test_the_sweep_reports_an_unheld_unreported_row_once(ledger: Ledger) -> None:
    row(ledger, "fin", RunState.FINISHED)
    row(ledger, "held", RunState.ACCEPTED)
    parts = build(ledger)
    parts.runs.hold(HeldRun("held", "run:held"))
    await parts.recovery.sweep_ledger()
    assert parts.settled == [("fin", DONE, True, NOW - 40)]
    # Its report failed and let it go; the row stays unreported, the sweep stays put.
    parts.runs.release(parts.runs["fin"])
    await parts.recovery.sweep_ledger()
    assert parts.settled == [("fin", DONE, True, NOW - 40)]
    assert list(parts.runs) == ["held"] and parts.queue.queued() == 0


class Unreadable:
    """The ledger with ``recover`` failing as an unreadable file fails it."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    def recover(self) -> Any:
        raise LedgerError("disk I/O error (test)")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)


@pytest.mark.protocol("§9")
async def test_ledger_settled_is_false_when_the_ledger_cannot_be_read(
    ledger: Ledger,
) -> None:
    steps = LedgerSteps(Unreadable(ledger))  # type: ignore[arg-type]
    assert await build(ledger, steps=steps).recovery.ledger_settled() is False


@pytest.mark.protocol("§9")
async def test_ledger_settled_only_when_nothing_but_outbox_rows_are_left(
    ledger: Ledger,
) -> None:
    parts = build(ledger)
    assert await parts.recovery.ledger_settled() is True
    row(ledger, "fin", RunState.FINISHED)  # its report waits for the server: no failure
    row(ledger, "done", RunState.REPORTED)
    assert await parts.recovery.ledger_settled() is True
    row(ledger, "acc", RunState.ACCEPTED)
    assert await parts.recovery.ledger_settled() is False
