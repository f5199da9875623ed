"""End to end: the real harness, the real reference server, real agent processes."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from prohost import AGENT_HEADER_VALUE
from prohost.engine.ledger import Ledger
from prohost.wire.protocol import Heartbeat, Status
from tests.kits.harness import agent_command, finished, messages, running_harness, running_server


@pytest.mark.protocol("§5", "§7")
async def test_a_run_is_executed_and_its_reply_posted(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=agent_command("reply.py", "fixed it")
        ):
            run_id = await server.submit_run("fix the test", conversation_id="C42")
            await server.wait_until(finished(run_id))
            record = server.run(run_id)
            assert record.state == "completed"
            assert record.completion is not None
            assert record.completion["ok"] is True
            assert record.completion["reply"] == "fixed it"
            assert record.idempotency_keys == [run_id]
            # The first messages on a connection are status, then heartbeat.
            first = [entry.message for entry in server.state.received][:2]
            assert isinstance(first[0], Status) and isinstance(first[1], Heartbeat)
            assert messages(server.state, Status)[0].machine == "test"
            # The handshake says who is calling (§1).
            [conn] = server.state.connections.values()
            assert (conn.machine, conn.agent) == ("test", AGENT_HEADER_VALUE)
            assert AGENT_HEADER_VALUE.startswith("prohost-python/")


@pytest.mark.protocol("§7")
async def test_an_unreadable_ledger_row_is_closed_not_met_at_every_start(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    ledger = Ledger.open(home / "ledger.sqlite3")
    try:
        # Accepted by some older, less strict version: not a body this one can run.
        ledger.admit("run_old", "conv:C1", '{"run_id": "run_old"}', 0.0)
    finally:
        ledger.close()
    with trio.fail_after(30):
        async with running_server() as server, running_harness(
            server, home, exec_command=agent_command("reply.py", "ok")
        ) as running:
            assert running.ledger is not None
            row = running.ledger.get("run_old")
            assert row is not None and row.state == "reported"
            assert row.settlement is not None and row.settlement.startswith("unreadable")
            assert "run_old" not in running.harness.held
