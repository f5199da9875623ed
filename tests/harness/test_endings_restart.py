"""Issue 37: a run the harness's ``kill -9`` interrupted is reported ``restarted``
like every other ending (§7): with what it changed, compared with the checkouts as
they were when it began (kept in the ledger with its agent's process group), and
how long it ran.

Real parts: the reference server on 127.0.0.1, the production harness as a
``python -m prohost agent run --repos …`` subprocess, real git and sqlite; the agent
is the test's gated ``deaf.py``, which commits its work before it says it started.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
import trio

from prohost.engine.ledger import RunState
from prohost.wire.outcomes import RESTARTED
from tests.kits.harness import agent_command, finished, start_run
from tests.kits.process import harness_process, kill_harness, ledger_row, paired_with_gate
from tests.kits.repos import make_readme_repo

pytestmark = pytest.mark.protocol("§7")


async def test_a_run_restarted_after_a_kill_carries_its_changes_and_duration(
    tmp_path: Path,
) -> None:
    app = await make_readme_repo(tmp_path / "code" / "app")
    home = tmp_path / "home"
    repos = ("--repos", str(app))
    with trio.fail_after(60):
        async with paired_with_gate(home) as (gate, server):
            command = agent_command("deaf.py", gate.port)
            async with harness_process(server, home, command, extra_args=repos) as first:
                # The agent has committed its work when it says it started.
                run_id = await start_run(server, gate, "work")
                killed_at = time.time()
                await kill_harness(server, first)
            row = ledger_row(home, run_id)
            assert row.state is RunState.STARTED and row.started_at is not None
            async with harness_process(server, home, command, extra_args=repos):
                await server.wait_until(finished(run_id))
                restarted_at = time.time()
    completion = server.run(run_id).completion
    assert completion is not None
    assert (completion["error"], completion["retryable"]) == (RESTARTED, True), completion
    [entry] = completion["changes"]
    assert (entry["repo"], entry["commits"]) == ("app", 1), entry
    assert entry["files"] == [{"path": f"work-{run_id}.txt", "change": "added",
                               "added": 1, "removed": 0, "committed": True}]
    # From `started` to the restart that found it: the run up to the kill, and no
    # more than until it was found.
    duration_ms = completion["duration_ms"]
    assert (killed_at - row.started_at) * 1000 <= duration_ms
    assert duration_ms <= (restarted_at - row.started_at) * 1000 + 1


async def test_a_run_an_earlier_prohost_started_is_reported_without_changes_and_said_so(
    tmp_path: Path,
) -> None:
    # The ledger of a prohost before the start state was kept (schema 3): its
    # started run is reported restarted with its duration, without `changes`, and
    # the log says why.
    app = await make_readme_repo(tmp_path / "code" / "app")
    home = tmp_path / "home"
    repos = ("--repos", str(app))
    with trio.fail_after(60):
        async with paired_with_gate(home) as (gate, server):
            command = agent_command("deaf.py", gate.port)
            async with harness_process(server, home, command, extra_args=repos) as first:
                run_id = await start_run(server, gate, "work")
                await kill_harness(server, first)
            with sqlite3.connect(home / "ledger.sqlite3") as conn:
                conn.execute("ALTER TABLE runs DROP COLUMN start_state")
                conn.execute("PRAGMA user_version = 3")
            async with harness_process(server, home, command, extra_args=repos) as second:
                await server.wait_until(finished(run_id))
                await second.wait_log(f"run {run_id}: the ledger does not say what its "
                                      "checkouts were when it began")
    completion = server.run(run_id).completion
    assert completion is not None
    assert (completion["error"], completion["retryable"]) == (RESTARTED, True), completion
    assert "changes" not in completion
    assert completion["duration_ms"] > 0
