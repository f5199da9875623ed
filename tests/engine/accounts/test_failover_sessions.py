"""A fail-over resumes the lane's session on the new account, never another account's
(docs/protocol.md §12 "Failing over"; issue 16 point 7).

Sessions live in an account's own configuration folder: a session id from one
account means nothing on another, and the CLI there either refuses it or, worse,
resumes some other conversation. The lane's sessions are seeded in the ledger
(one per account, as earlier turns left them); each account is a config folder
of tests/agents/fake_claude.py, limited through a ``limit`` file the way the CLI
says it; every invocation's arguments and folder are recorded, so the test sees
which session each attempt resumed where.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from prohost.engine.agent.environment import scratch_folder
from prohost.engine.ledger import Ledger
from prohost.server import ServerHandle
from tests.kits.accounts import folders, limit
from tests.kits.fake_clis import FAKE_CLAUDE, claude_env, invocations, resumed
from tests.kits.harness import finished, running_harness, running_server

pytestmark = pytest.mark.protocol("§12")

LANE = "conv:C1"
HOUR = 3600.0


def seed_sessions(home: Path, sessions: dict[str, str], last: str) -> None:
    """The lane's session on each named account, ``last`` being its account now."""
    home.mkdir(parents=True, exist_ok=True)
    with Ledger.open(home / "ledger.sqlite3") as ledger:
        for account, session in sessions.items():
            if account != last:
                ledger.save_turn(LANE, account, session, time.time())
        ledger.save_turn(LANE, last, sessions[last], time.time())


def lane_on_a(tmp_path: Path, names: list[str], limited: list[str],
              ) -> tuple[tuple[tuple[str, Path], ...], Path]:
    """Accounts ``names`` in folders of their own and a home whose lane last ran on
    ``a``, with sess-a on a and sess-b on b; the ``limited`` ones at their limit for
    an hour. The accounts and the home."""
    accounts = folders(tmp_path, *names)
    home = tmp_path / "home"
    seed_sessions(home, {"a": "sess-a", "b": "sess-b"}, last="a")
    for name in limited:
        limit(dict(accounts)[name], time.time() + HOUR)
    return accounts, home


def attempts(tmp_path: Path) -> list[tuple[str, str | None]]:
    """(account, session resumed) for each invocation of the fake CLI."""
    return [(Path(i["login_dir"]).name.removeprefix("cfg-"), resumed(i))
            for i in invocations(tmp_path)]


def sessions_kept(home: Path, *accounts: str) -> dict[str, str | None]:
    with Ledger.open(home / "ledger.sqlite3") as ledger:
        return {account: ledger.account_session(LANE, account) for account in accounts}


async def one_turn(server: ServerHandle) -> dict[str, object]:
    run_id = await server.submit_run("go on", conversation_id="C1")
    await server.wait_until(finished(run_id))
    completion = server.run(run_id).completion
    assert completion is not None
    return completion


async def test_each_fail_over_resumes_the_new_accounts_own_session_or_a_fresh_one(
    tmp_path: Path,
) -> None:
    """a and b are limited; the run goes a → b → c, resuming sess-a on a, sess-b on
    b, and nothing on c (the lane has no session there), never one of the others."""
    accounts, home = lane_on_a(tmp_path, ["a", "b", "c"], limited=["a", "b"])
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, home, exec_command=FAKE_CLAUDE, brain="claude",
            env=claude_env(tmp_path), accounts=accounts,
        ):
            completion = await one_turn(server)
    assert attempts(tmp_path) == [("a", "sess-a"), ("b", "sess-b"), ("c", None)]
    assert completion["ok"] is True and completion["account"] == "c"
    fresh = completion["session_id"]
    assert fresh not in (None, "sess-a", "sess-b")
    # Each account keeps its own session; the turn's session is saved on c only.
    assert sessions_kept(home, "a", "b", "c") == {"a": "sess-a", "b": "sess-b", "c": fresh}


async def test_a_new_accounts_session_the_cli_refuses_is_replaced_by_a_fresh_one_there(
    tmp_path: Path,
) -> None:
    """On b the CLI does not know sess-b: the retry there is fresh, not sess-a."""
    accounts, home = lane_on_a(tmp_path, ["a", "b"], limited=["a"])
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, home, exec_command=FAKE_CLAUDE, brain="claude",
            env=claude_env(tmp_path, "no_session"), accounts=accounts,
        ):
            completion = await one_turn(server)
    assert attempts(tmp_path) == [("a", "sess-a"), ("b", "sess-b"), ("b", None)]
    assert completion["ok"] is True and completion["account"] == "b"
    fresh = completion["session_id"]
    assert fresh not in (None, "sess-a", "sess-b")
    assert sessions_kept(home, "a", "b") == {"a": "sess-a", "b": fresh}


@pytest.mark.protocol("§6")
async def test_a_run_cancelled_while_waiting_to_fail_over_keeps_each_accounts_session(
    tmp_path: Path,
) -> None:
    """Both accounts refuse; the run waits for a reset and is cancelled meanwhile. It
    is reported with its last attempt's account and session (b, sess-b), and the
    ledger keeps sess-a on a: nothing is saved under the wrong account."""
    accounts, home = lane_on_a(tmp_path, ["a", "b"], limited=["a", "b"])
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, home, exec_command=FAKE_CLAUDE, brain="claude",
            env=claude_env(tmp_path), accounts=accounts, limit_wait_s=HOUR,
        ) as running:
            run_id = await server.submit_run("go on", conversation_id="C1")
            await running.harness.wait_until(lambda h: run_id in h.held and
                                             h.held[run_id].waiting_until is not None)
            await server.cancel_run(run_id, "the user gave up")
            await server.wait_until(finished(run_id))
            completion = server.run(run_id).completion
    assert attempts(tmp_path) == [("a", "sess-a"), ("b", "sess-b")]
    assert completion is not None
    assert (completion["account"], completion["session_id"]) == ("b", "sess-b")
    assert "cancelled" in completion["error"]
    assert sessions_kept(home, "a", "b") == {"a": "sess-a", "b": "sess-b"}


async def test_a_fail_over_that_cannot_prepare_the_new_account_keeps_its_session(
    tmp_path: Path,
) -> None:
    """The run's MCP configuration cannot be written for b (its folder is taken by a
    file): the agent never starts there, and the lane's session on b is kept, not
    forgotten as if b's turn had ended without one."""
    accounts, home = lane_on_a(tmp_path, ["a", "b"], limited=["a"])
    run_id = "run_mcp_on_b"
    scratch = scratch_folder(home / "runs", run_id)
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, home, exec_command=FAKE_CLAUDE, brain="claude",
            env=claude_env(tmp_path), accounts=accounts,
        ):
            # Laid once the harness is up: its start sweeps leftover run folders.
            scratch.mkdir(parents=True)
            (scratch / "account-1").write_text("in the way\n")  # where b's config goes
            server.state.add_run("go on", "C1", extra={
                "run_id": run_id, "mcp": {"url": "https://mcp.example/x", "token": "t0k"}})
            await server.wait_until(finished(run_id))
            completion = server.run(run_id).completion
    assert attempts(tmp_path) == [("a", "sess-a")]
    assert completion is not None and completion["account"] == "b"
    assert "MCP server could not be prepared" in completion["error"]
    assert sessions_kept(home, "a", "b") == {"a": "sess-a", "b": "sess-b"}
