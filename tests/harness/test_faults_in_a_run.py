"""Every run is reported, whatever happens inside it (issue 8, reproduction 5).

A fault is injected at each step of a run's life; everything else is real: the
production harness, the reference server on 127.0.0.1, agent subprocesses and the
sqlite ledger. Each time the server hears exactly one report, ``ok: false``,
retryable, ``internal error: <type>: <message>``; the ledger row is settled; and
the conversation's next turn runs (its lane and the only slot were freed).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from prohost.engine.agent.brains.claude import ClaudeTurn
from prohost.engine.ledger import Ledger, LedgerError, RunState
from prohost.engine.report.reporter import Reporter
from prohost.engine.repos.worktrees import WorktreeManager
from tests.kits.fake_clis import FAKE_CLAUDE
from tests.kits.harness import (
    Running,
    agent_command,
    finished,
    running_harness,
    running_server,
)

pytestmark = pytest.mark.protocol("§7")

REPLY = agent_command("reply.py", "done")


def reraise_once(original: Callable[..., Any], error: BaseException) -> Callable[..., Any]:
    """``original``, except that its first call raises ``error``."""
    failed = False

    def maybe_fail(*args: Any, **kwargs: Any) -> Any:
        nonlocal failed
        if not failed:
            failed = True
            raise error
        return original(*args, **kwargs)

    return maybe_fail


async def one_turn_fails_then_the_next_runs(running: Running, error: str) -> None:
    """Run A on a conversation (the fault hits it), then A2 on the same one."""
    server = running.server
    ledger = running.ledger
    assert ledger is not None
    first = await server.submit_run("turn 1", conversation_id="C1")
    await server.wait_until(finished(first))
    await running.harness.wait_until(lambda h: first not in h.held)
    record = server.run(first)
    assert record.completion_posts == 1
    completion = record.completion or {}
    assert completion["ok"] is False and completion["retryable"] is True
    assert completion["error"] == error
    row = ledger.get(first)
    assert row is not None and row.state is RunState.REPORTED
    # The lane and the only slot are free: the conversation goes on.
    second = await server.submit_run("turn 2", conversation_id="C1")
    await server.wait_until(finished(second))
    assert (server.run(second).completion or {})["ok"] is True, server.run(second).completion
    assert server.run(second).completion_posts == 1


def logged_with_traceback(caplog: pytest.LogCaptureFixture, what: str) -> bool:
    return any(
        record.name == "prohost.runner" and record.exc_info is not None
        and what in record.getMessage() for record in caplog.records
    )


async def test_a_failed_ledger_read_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The lane's session on its account: the read every run makes before its spawn.
    monkeypatch.setattr(Ledger, "account_session", reraise_once(
        Ledger.account_session, LedgerError("the run ledger failed: disk I/O error")))
    with trio.fail_after(60), caplog.at_level(logging.ERROR, "prohost.runner"):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=REPLY, concurrency=1,
        ) as running:
            await one_turn_fails_then_the_next_runs(
                running, "internal error: LedgerError: the run ledger failed: disk I/O error")
    assert logged_with_traceback(caplog, "internal error")


async def test_a_failed_worktree_prepare_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(WorktreeManager, "prepare", reraise_once(
        WorktreeManager.prepare, RuntimeError("prepare broke")))
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=REPLY, concurrency=1,
            repos=(tmp_path / "app",),
        ) as running:
            await one_turn_fails_then_the_next_runs(
                running, "internal error: RuntimeError: prepare broke")


async def test_a_spawn_that_raises_is_reported(tmp_path: Path) -> None:
    # A NUL byte in a variable makes the spawn itself raise ValueError (not an
    # OSError, which the runner already describes as "could not start").
    env = {**os.environ, "PROHOST_TEST_BROKEN": "a\0b"}
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=REPLY, concurrency=1, env=env,
        ) as running:
            first = await server.submit_run("turn 1", conversation_id="C1")
            await server.wait_until(finished(first))
            completion = server.run(first).completion or {}
            assert completion["error"] == "internal error: ValueError: embedded null byte"
            assert completion["retryable"] is True
            assert server.run(first).completion_posts == 1
            await running.harness.wait_until(lambda h: first not in h.held)
            del running.harness.env["PROHOST_TEST_BROKEN"]
            second = await server.submit_run("turn 2", conversation_id="C1")
            await server.wait_until(finished(second))
            assert (server.run(second).completion or {})["ok"] is True


async def test_a_brain_parser_that_raises_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ClaudeTurn, "feed", reraise_once(
        ClaudeTurn.feed, KeyError("usage")))
    env = {**os.environ, "FAKE_CLAUDE_SCENARIO": "reply"}
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=FAKE_CLAUDE, brain="claude",
            concurrency=1, env=env,
        ) as running:
            await one_turn_fails_then_the_next_runs(running, "internal error: KeyError: 'usage'")


async def test_a_report_that_raises_stays_in_the_outbox_for_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setattr(Reporter, "complete", reraise_once(
        Reporter.complete, RuntimeError("reporter broke")))
    with trio.fail_after(60):
        async with running_server() as server:
            async with running_harness(
                server, home, exec_command=REPLY, concurrency=1,
            ) as running:
                ledger = running.ledger
                assert ledger is not None
                first = await server.submit_run("turn 1", conversation_id="C1")
                await server.wait_until(lambda s: s.runs[first].state == "accepted")
                await running.harness.wait_until(lambda h: first not in h.held)
                assert server.run(first).completion_posts == 0
                row = ledger.get(first)
                # Still the outbox: the outcome is saved, the report is not settled.
                assert row is not None and row.state is RunState.FINISHED
                # Its lane and the only slot were freed all the same.
                second = await server.submit_run("turn 2", conversation_id="C1")
                await server.wait_until(finished(second))
            # The next start posts the saved outcome, once.
            async with running_harness(
                server, home, exec_command=REPLY, concurrency=1,
            ) as restarted:
                await server.wait_until(finished(first))
                await restarted.harness.wait_until(lambda h: first not in h.held)
                assert server.run(first).completion_posts == 1
                assert (server.run(first).completion or {})["reply"] == "done"
                assert restarted.ledger is not None
                row = restarted.ledger.get(first)
                assert row is not None and row.state is RunState.REPORTED
