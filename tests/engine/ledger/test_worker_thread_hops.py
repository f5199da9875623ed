"""How many worker-thread hops a run's ledger steps take (each costs the harness's one
trio thread CPU): the real harness, the reference server on 127.0.0.1, a real agent
subprocess and the sqlite ledger. Every bounded ledger step goes through ``Bounds.run``
(a worker thread) or ``Bounds.wait`` (a job of the ledger's writer thread), which the
test counts (and still runs: tests/kits/harness.py ``counted_steps``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from prohost.engine.ledger import RunState
from tests.kits.harness import (
    agent_command,
    counted_steps,
    finished,
    running_harness,
    running_server,
)
from tests.kits.ledger import Commits

REPLY = agent_command("reply.py", "done")


async def test_a_run_takes_at_most_five_hops_for_its_ledger_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hops = counted_steps(monkeypatch)
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=REPLY, concurrency=1,
        ) as running:
            assert running.ledger is not None
            commits = Commits(running.ledger)
            before = len(hops)
            run_id = await server.submit_run("turn 1", conversation_id="C1")
            await server.wait_until(finished(run_id))
            await running.harness.wait_until(lambda h: run_id not in h.held)
            ours = hops[before:]
            assert running.ledger is not None
            row = running.ledger.get(run_id)
    assert server.run(run_id).completion_posts == 1
    assert row is not None and row.state is RunState.REPORTED and row.pgid is not None
    # accepted; started with the lane's session read; finished with the session saved;
    # the agent's group and `reported` only when no ledger writer was at work to take
    # them. (It was seven: each step and the session read and save on its own.)
    assert 3 <= len(ours) <= 5, ours
    # Four of its commits fsync'd, as sqlite ran them: accepted, started, the agent's
    # process group (before its output is read: §7) and finished.
    assert commits.durable == 4, commits.counts()
