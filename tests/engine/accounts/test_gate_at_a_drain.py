"""A drain hands back the runs waiting for an account at once (docs/protocol.md §9, §12;
issue 16 point 5).

While every account is at its usage limit, a run waits at the account gate for the
earliest reset, up to --limit-wait (15 minutes by default). Such a run is neither
queued nor running, so the first signal used to leave it waiting: the drain, and
the process, lasted until the limit-wait ran out. §9 says such runs are reported
at once, like queued runs: ``the agent is shutting down; the run was not started``,
retryable, so the server can send them to a machine whose accounts can take them.

The harness tests use real parts (the reference server, the production harness,
the sqlite ledger, tests/agents/fake_claude.py with one config folder per account,
limited the way the CLI says it is); --limit-wait is an hour, so a drain that
waited for it would trip the tests' guard.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio
import trio.testing

from prohost.engine.accounts.book import Account, AccountBook
from prohost.engine.accounts.gate import AccountGate
from prohost.engine.ledger import Ledger, UnreportedRuns
from prohost.engine.run.progress import Progress
from prohost.wire.outcomes import NOT_STARTED
from prohost.wire.runs import Outcome
from tests.kits.accounts import folders, limit, seed
from tests.kits.fake_clis import FAKE_CLAUDE, claude_env, invocations
from tests.kits.harness import finished, running_harness, running_server
from tests.kits.paths import logs_folder

pytestmark = pytest.mark.protocol("§9", "§12")

HOUR = 3600.0
NOT_STARTED_REPORT = {"ok": False, "retryable": True, "error": NOT_STARTED}


async def test_turning_away_ends_every_wait_at_once_in_virtual_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The gate alone, in virtual time: three runs wait (limit-wait 15 minutes);
    turn_away ends their waits without the clock moving, and a later run that
    would wait does not."""
    epoch = 1_800_000_000.0
    now = [epoch]
    book = AccountBook([Account("work"), Account("personal")])
    for name in ("work", "personal"):
        book.restore(name, epoch + HOUR, epoch)
    gate = AccountGate(book, limit_wait_s=900, clock=lambda: now[0],
                       on_change=lambda: None, save_limits=_nothing)
    turned_away = Outcome.failure(NOT_STARTED, retryable=True)
    results: dict[str, object] = {}
    progress = {run_id: Progress() for run_id in ("r1", "r2", "r3")}

    async def wait(run_id: str) -> None:
        results[run_id] = await gate.wait_for_account(run_id, progress[run_id], None)

    async with trio.open_nursery() as nursery:
        for run_id in progress:
            nursery.start_soon(wait, run_id)
        await trio.testing.wait_all_tasks_blocked()
        assert all(p.waiting_until == epoch + HOUR for p in progress.values())
        drained_at = trio.current_time()
        gate.turn_away(turned_away)
    assert trio.current_time() == drained_at
    assert results == {run_id: turned_away for run_id in progress}
    assert all(p.waiting_until is None for p in progress.values())
    assert await gate.wait_for_account("r4", Progress(), None) == turned_away
    assert trio.current_time() == drained_at
    # Once an account is usable again, a run still gets it: only waiting is refused.
    now[0] = epoch + HOUR
    chosen = await gate.wait_for_account("r5", Progress(), None)
    assert isinstance(chosen, Account)


async def _nothing(limits: dict[str, float]) -> None:
    """``save_limits`` for a gate with no ledger."""


async def test_a_drain_reports_the_runs_waiting_for_an_account_at_once(tmp_path: Path) -> None:
    """Two accepted runs wait, every account being limited (as a restart finds them);
    the first signal reports both "not started", retryable, and the harness exits 0
    without waiting out --limit-wait. The ledger has both reported: a restart does
    not report them again."""
    accounts = folders(tmp_path, "work", "personal")
    home = tmp_path / "home"
    until = time.time() + HOUR
    with trio.fail_after(30):
        async with running_server() as server:
            waiting = [await server.submit_run(f"waiting {n}", conversation_id=f"W{n}")
                       for n in range(2)]
            seed(home, server, waiting, {"work": until, "personal": until})
            async with running_harness(
                server, home, exec_command=FAKE_CLAUDE, brain="claude",
                env=claude_env(tmp_path), accounts=accounts, limit_wait_s=HOUR,
                concurrency=2,
            ) as running:
                harness = running.harness
                await harness.wait_until(lambda h: len(h.held) == 2 and all(
                    held.waiting_until is not None for held in h.held.values()))
                harness.drain()
                assert await running.wait_exit() == 0
            await server.wait_until(finished(*waiting))
            for run_id in waiting:
                record = server.run(run_id)
                assert record.completion == {"run_id": run_id, **NOT_STARTED_REPORT}
                assert record.completion_posts == 1
            assert not (logs_folder(tmp_path) / "record.json").exists(), "no agent was started"
    with Ledger.open(home / "ledger.sqlite3") as ledger:
        assert ledger.recover() == UnreportedRuns(pending=[], interrupted=[], outbox=[])


async def test_a_drain_ends_a_fail_over_wait_with_the_limited_attempt_reported(
    tmp_path: Path,
) -> None:
    """The run's only account says it is at its limit (the fake CLI, through its
    config folder): the run waits for the reset to fail over. The drain ends that
    wait at once; the run is reported once, retryable, with what its attempt said."""
    accounts = folders(tmp_path, "solo")
    home = tmp_path / "home"
    until = int(time.time() + HOUR)
    limit(accounts[0][1], until)
    with trio.fail_after(30):
        async with running_server() as server, running_harness(
            server, home, exec_command=FAKE_CLAUDE, brain="claude",
            env=claude_env(tmp_path), accounts=accounts, limit_wait_s=HOUR,
        ) as running:
            harness = running.harness
            run_id = await server.submit_run("hits the limit", conversation_id="L")
            await harness.wait_until(lambda h: run_id in h.held and
                                     h.held[run_id].waiting_until is not None)
            harness.drain()
            assert await running.wait_exit() == 0
            await server.wait_until(finished(run_id))
            record = server.run(run_id)
            assert record.completion_posts == 1
            completion = record.completion
            assert completion is not None
            assert (completion["ok"], completion["retryable"], completion["account"]) == (
                False, True, "solo")
            assert "limit" in completion["error"]
            assert len(invocations(tmp_path)) == 1, "the agent ran once"
    with Ledger.open(home / "ledger.sqlite3") as ledger:
        assert ledger.recover() == UnreportedRuns(pending=[], interrupted=[], outbox=[])
