"""Several agent accounts through the whole harness (docs/protocol.md §12).

The harness is the production one against the reference server; the agent is
tests/agents/fake_claude.py as a real subprocess, and each account is a temp
config folder. A file ``limit`` (a reset epoch) in a folder makes that account
refuse work the way Claude Code does at its usage limit. The ledger is a real
sqlite file: limits and queued runs are seeded there, as a restart finds them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from prohost.engine.accounts.book import Account, AccountBook
from prohost.engine.accounts.gate import AccountGate
from prohost.engine.accounts.limits import LimitNotice
from prohost.server import ServerHandle
from prohost.wire import intake
from prohost.wire.outcomes import all_limited_reason
from prohost.wire.protocol import Delivery, Heartbeat, Status
from tests.kits.accounts import accounts_used, folders, limit, seed
from tests.kits.fake_clis import FAKE_CLAUDE, claude_env, invocations, resumed
from tests.kits.harness import (
    acks,
    finished,
    messages,
    running_harness,
    running_server,
    wall_clock_bound,
)
from tests.kits.paths import logs_folder

pytestmark = pytest.mark.protocol("§12")


def last_accounts(server: ServerHandle) -> dict[str, dict[str, Any]]:
    status = messages(server.state, Status)[-1]
    return {row.name: {"state": row.state, "resets_at": row.resets_at}
            for row in status.accounts}


def trio_epoch() -> Callable[[], float]:
    """Wall-clock epoch seconds that move with trio's (mock) clock, for the harness's
    account book: a reset "passes" when the test moves the clock, not on its own."""
    base = time.time() - trio.current_time()
    return lambda: base + trio.current_time()


async def test_a_limited_account_hands_every_run_to_the_free_one(tmp_path: Path) -> None:
    accounts = folders(tmp_path, "work", "personal")
    until = int(time.time()) + 3600
    limit(accounts[0][1], until)
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=FAKE_CLAUDE, brain="claude",
            env=claude_env(tmp_path), accounts=accounts,
        ) as running:
            runs = []
            for lane in ("A", "B", "C"):
                runs.append(await server.submit_run(f"job {lane}", conversation_id=lane))
                await server.wait_until(finished(runs[-1]))
            for run_id in runs:
                record = server.run(run_id)
                assert record.completion_posts == 1
                assert record.completion is not None
                assert record.completion["ok"] is True, record.completion
                assert record.completion["account"] == "personal"
            # Only the first run met the limit; the book kept it from the others.
            assert accounts_used(tmp_path) == ["work", "personal", "personal", "personal"]
            await server.wait_until(
                lambda s: last_accounts(server)["work"]["state"] == "limited")
            assert last_accounts(server) == {
                "work": {"state": "limited", "resets_at": until},
                "personal": {"state": "ok", "resets_at": None},
            }
            # The panel and `agent status` (status.json) show the same.
            shown = {row.name: row.state for row in running.harness.snapshot().accounts}
            assert shown == {"work": "limited", "personal": "ok"}


async def test_a_lane_keeps_its_account_and_its_session_on_each(
    tmp_path: Path, mock_clock: trio.testing.MockClock,
) -> None:
    accounts = folders(tmp_path, "a", "b")
    folder = dict(accounts)
    clock = trio_epoch()  # a reset passes when the test moves trio's clock
    # Trio's clock stands still here: fail_after would never fire.
    async with wall_clock_bound(120), running_server() as server, running_harness(
        server, tmp_path / "home", exec_command=FAKE_CLAUDE, brain="claude",
        env=claude_env(tmp_path), accounts=accounts, clock=clock,
    ):
        async def turn(lane: str) -> dict[str, Any]:
            run_id = await server.submit_run(f"turn on {lane}", conversation_id=lane)
            await server.wait_until(finished(run_id))
            completion = server.run(run_id).completion
            assert completion is not None and completion["ok"] is True, completion
            return completion

        first = await turn("C1")
        other = await turn("C2")  # the least recently started account: b
        second = await turn("C1")  # C1 stays on a, in its session
        assert (first["account"], other["account"], second["account"]) == ("a", "b", "a")
        assert second["session_id"] == first["session_id"]

        # a hits its limit (resetting soon): C1 moves to b, fresh there.
        limit(folder["a"], clock() + 2)
        moved = await turn("C1")
        assert moved["account"] == "b"
        assert moved["session_id"] != first["session_id"]
        # The reset passing makes a usable again, and says so in status.
        mock_clock.jump(2)
        await server.wait_until(lambda s: last_accounts(server)["a"]["state"] == "ok")
        (folder["a"] / "limit").unlink()
        # Now b is limited: C1 goes back to a and to its old session there.
        limit(folder["b"], clock() + 3600)
        back = await turn("C1")
        assert back["account"] == "a"
        assert back["session_id"] == first["session_id"]
        assert accounts_used(tmp_path) == ["a", "b", "a", "a", "b", "b", "a"]
        assert [resumed(i) for i in invocations(tmp_path)][-2:] == [
            moved["session_id"], first["session_id"]]


@pytest.mark.protocol("§3")
async def test_with_every_account_limited_deliveries_get_503_and_queued_runs_wait_then_fail(
    tmp_path: Path, mock_clock: trio.testing.MockClock,
) -> None:
    accounts = folders(tmp_path, "work", "personal")
    until = time.time() + 3600
    home = tmp_path / "home"
    reason = all_limited_reason(until - 60)
    # Trio's clock stands still here: fail_after would never fire.
    async with wall_clock_bound(120), running_server() as server:
        queued = [await server.submit_run(f"queued {n}", conversation_id=f"Q{n}")
                  for n in range(2)]
        seed(home, server, queued, {"work": until, "personal": until - 60})
        async with running_harness(
            server, home, exec_command=FAKE_CLAUDE, brain="claude",
            env=claude_env(tmp_path), accounts=accounts, limit_wait_s=1.5,
        ) as running:
            fresh = await server.submit_run("new work", conversation_id="N")
            await server.wait_until(lambda s: any(
                a.status == 503 and s.deliveries.get(a.id) == fresh for a in acks(s)))
            refusals = [a for a in acks(server.state)
                        if server.state.deliveries.get(a.id) == fresh]
            assert refusals[0].status == 503
            assert refusals[0].reason == reason
            assert reason.endswith("Z") and "T" in reason
            # A queued run waits for the earliest reset, and its heartbeat says so.
            harness = running.harness
            await harness.wait_until(lambda h: any(
                held.progress.waiting_until is not None for held in h.held.values()))
            waiting = next(h for h in harness.held.values()
                           if h.progress.waiting_until is not None)
            reset_clock = time.strftime("%H:%M", time.localtime(until - 60))
            assert waiting.beat().activity == \
                    f"waiting for an account (resets {reset_clock})"
            assert waiting.beat().state == "queued"
            assert not any(server.run(run_id).completion for run_id in queued)
            # Past --limit-wait (trio's clock, standing still until now), each is
            # reported retryable, and no agent ran.
            mock_clock.jump(1.5)
            await server.wait_until(finished(*queued))
            for run_id in queued:
                assert server.run(run_id).completion == {
                    "run_id": run_id, "ok": False, "retryable": True, "error": reason}
            assert not (logs_folder(tmp_path) / "record.json").exists()
            assert [row.state for row in messages(server.state, Status)[-1].accounts] == [
                "limited", "limited"]


async def test_a_reset_passing_lets_a_waiting_run_go(
    tmp_path: Path, mock_clock: trio.testing.MockClock,
) -> None:
    accounts = folders(tmp_path, "solo")
    home = tmp_path / "home"
    clock = trio_epoch()
    # Trio's clock stands still here: fail_after would never fire.
    async with wall_clock_bound(120), running_server() as server:
        run_id = await server.submit_run("soon", conversation_id="S")
        seed(home, server, [run_id], {"solo": clock() + 1.5})
        async with running_harness(
            server, home, exec_command=FAKE_CLAUDE, brain="claude",
            env=claude_env(tmp_path), accounts=accounts, limit_wait_s=600, clock=clock,
        ) as running:
            await running.harness.wait_until(lambda h: any(
                held.progress.waiting_until is not None for held in h.held.values()))
            assert server.run(run_id).completion is None
            await server.wait_until(lambda s: bool(messages(s, Status)))
            mock_clock.jump(1.5)  # the reset passes
            await server.wait_until(finished(run_id))
            completion = server.run(run_id).completion
            assert completion is not None and completion["ok"] is True
            assert completion["account"] == "solo"
            assert accounts_used(tmp_path) == ["solo"]
            states = [row.state for m in messages(server.state, Status)
                      for row in m.accounts]
            assert states[0] == "limited" and states[-1] == "ok"


async def test_a_restart_remembers_a_limit(tmp_path: Path) -> None:
    accounts = folders(tmp_path, "work", "personal")
    limit(accounts[0][1], time.time() + 3600)
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with running_server() as server:
            for lane in ("before", "after"):
                async with running_harness(
                    server, home, exec_command=FAKE_CLAUDE, brain="claude",
                    env=claude_env(tmp_path), accounts=accounts,
                ):
                    run_id = await server.submit_run("job", conversation_id=lane)
                    await server.wait_until(finished(run_id))
                    completion = server.run(run_id).completion
                    assert completion is not None and completion["account"] == "personal"
                await server.wait_until(lambda s: s.connected == 0)
            # The second harness never tried the limited account.
            assert accounts_used(tmp_path) == ["work", "personal", "personal"]


@pytest.mark.protocol("§2")
async def test_heartbeats_name_the_account_of_a_running_run(tmp_path: Path) -> None:
    accounts = folders(tmp_path, "work")
    # The agent holds at FAKE_CLAUDE_GATE until told to go; nobody ever tells it
    # (the listener never accepts), so it runs until the harness stops it.
    gate = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = gate.socket.getsockname()[1]
    with trio.fail_after(60):
        async with gate, running_server(heartbeat_s=5) as server, running_harness(
            server, tmp_path / "home", exec_command=FAKE_CLAUDE, brain="claude",
            env=claude_env(tmp_path, FAKE_CLAUDE_GATE=str(port)), accounts=accounts,
        ):
            run_id = await server.submit_run("slow", conversation_id="H")

            def beat_of(state: Any) -> Any:
                beats = [b for m in messages(state, Heartbeat) for b in m.runs
                         if b.run_id == run_id and b.state == "running"]
                return beats[-1] if beats else None

            await server.wait_until(lambda s: beat_of(s) is not None)
            assert beat_of(server.state).account == "work"


@pytest.mark.protocol("§3")
def test_every_account_limited_is_a_503_in_section_3s_order() -> None:
    """413, 401 and 400 win; a run past them carries the 503 it gets if it is new."""
    reason = all_limited_reason(1_800_000_000)
    assert reason == "every account is at its usage limit until 2027-01-15T08:00:00Z"
    unsigned = Delivery(id="d1", event="agent.run", timestamp=0, body="{not json")
    verdict = intake.classify(unsigned, secret="s", now=0, draining=False,
                              allow_unverified=False, unavailable=reason)
    assert verdict.status == 401
    huge = Delivery(id="d2", event="agent.run", body="x" * (intake.MAX_BODY_BYTES + 1))
    assert intake.classify(huge, secret="s", now=0, draining=False, allow_unverified=False,
                           unavailable=reason).status == 413


@pytest.mark.protocol("§3")
async def test_both_accounts_refusing_is_one_retryable_report_then_503s(
    tmp_path: Path, mock_clock: trio.testing.MockClock,
) -> None:
    """Done when: with both limited (learned from the CLI itself) the run tries each
    once, waits up to --limit-wait, is reported once, retryable; new work gets 503
    with the earliest reset."""
    accounts = folders(tmp_path, "work", "personal")
    now = int(time.time())
    limit(accounts[0][1], now + 3600)
    limit(accounts[1][1], now + 1800)
    # Trio's clock stands still here: fail_after would never fire.
    async with wall_clock_bound(120), running_server() as server, running_harness(
        server, tmp_path / "home", exec_command=FAKE_CLAUDE, brain="claude",
        env=claude_env(tmp_path), accounts=accounts, limit_wait_s=1,
    ) as running:
        run_id = await server.submit_run("job", conversation_id="A")
        await running.harness.wait_until(lambda h: any(
            held.progress.waiting_until is not None for held in h.held.values()))
        held = running.harness.held[run_id]
        assert held.state == "running"
        assert held.beat().activity is not None
        assert held.beat().activity.startswith("waiting for an account (resets ")
        assert server.run(run_id).completion is None
        mock_clock.jump(1)  # --limit-wait passes (trio's clock stood still until now)
        await server.wait_until(finished(run_id))
        record = server.run(run_id)
        assert record.completion_posts == 1
        assert record.completion is not None
        assert record.completion["ok"] is False
        assert record.completion["retryable"] is True
        assert record.completion["account"] == "personal"
        assert "hit your limit" in record.completion["error"]
        assert accounts_used(tmp_path) == ["work", "personal"]
        later = await server.submit_run("more", conversation_id="B")
        await server.wait_until(lambda s: any(
            s.deliveries.get(a.id) == later for a in acks(s)))
        ack = next(a for a in acks(server.state) if server.state.deliveries.get(a.id) == later)
        assert (ack.status, ack.reason) == (503, all_limited_reason(now + 1800))


async def test_limit_wait_counts_afresh_each_time_every_account_is_limited(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """--limit-wait runs from when the last usable account was lost, one clock for
    every queued run, and starts again after an account was usable in between."""
    now = [1000.0]
    book = AccountBook([Account("solo", Path("/accounts/solo"))])

    async def no_ledger(limits: dict[str, float]) -> None:
        """Nothing learns a limit here, so nothing is saved."""

    gate = AccountGate(book, limit_wait_s=60, clock=lambda: now[0], on_change=lambda: None,
                       save_limits=no_ledger)
    assert gate.limit_wait_deadline() is None
    book.report("solo", LimitNotice("limited", resets_at=1100.0), now[0])
    lost = trio.current_time()
    assert gate.limit_wait_deadline() == lost + 60
    await trio.sleep(30)
    assert gate.limit_wait_deadline() == lost + 60  # the same wait, not a new one
    now[0] = 1150.0  # the reset passed
    assert gate.limit_wait_deadline() is None
    book.report("solo", LimitNotice("limited", resets_at=1300.0), now[0])
    assert gate.limit_wait_deadline() == trio.current_time() + 60


async def test_an_account_repeating_a_passed_reset_keeps_the_run_waiting(
    tmp_path: Path, mock_clock: trio.testing.MockClock,
) -> None:
    # Issue 37 point 9: a and b are limited; a's reset passes, a is tried again and
    # answers the same (now past) reset time. That time is unknown, not now: the
    # run keeps waiting within --limit-wait instead of being handed back.
    accounts = folders(tmp_path, "a", "b")
    folder = dict(accounts)
    home = tmp_path / "home"
    clock = trio_epoch()
    a_resets = clock() + 1.5
    (folder["a"] / "limit").write_text(f"{int(a_resets)} legacy\n")
    limit(folder["b"], clock() + 3600)
    async with wall_clock_bound(120), running_server() as server:
        run_id = await server.submit_run("soon", conversation_id="S")
        seed(home, server, [run_id], {"a": a_resets, "b": clock() + 3600})
        async with running_harness(
            server, home, exec_command=FAKE_CLAUDE, brain="claude",
            env=claude_env(tmp_path), accounts=accounts, limit_wait_s=600, clock=clock,
        ) as running:
            harness = running.harness

            def tried_then_waiting(h: Any) -> bool:
                held = h.held.get(run_id)
                return held is None or (held.progress.attempts >= 1
                                        and held.progress.waiting_until is not None)

            await harness.wait_until(lambda h: any(
                held.progress.waiting_until is not None for held in h.held.values()))
            mock_clock.jump(2)  # a's reset passes; a still refuses, saying the same
            await harness.wait_until(tried_then_waiting)
            assert server.run(run_id).completion is None, server.run(run_id).completion
            assert accounts_used(tmp_path) == ["a"]
            (folder["a"] / "limit").unlink()  # a is free at last
            mock_clock.jump(60)  # tried again after the backoff
            await server.wait_until(finished(run_id))
    completion = server.run(run_id).completion
    assert completion is not None and completion["ok"] is True, completion
    assert accounts_used(tmp_path) == ["a", "a"]
