"""Each durable step of a run is committed with its fsync (issue 37 point 10).

The fault matrix proves what a step's failure does; a commit that is simply not
fsync'd fails nothing a process can see until the machine goes down. So here the
ledger's real group commit is watched through one real run of the production
harness against the reference server: every commit that holds a durable step
(``admit``, ``mark_started``, ``record_pgid``, ``mark_finished``) ran under
``PRAGMA synchronous = FULL``, the one that fsyncs the WAL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from prohost.engine.ledger.writer import GroupCommit
from tests.kits.harness import agent_command, finished, running_harness, running_server

pytestmark = pytest.mark.protocol("§7")

DURABLE_STEPS = ("admit", "mark_started", "record_pgid", "mark_finished")


async def test_every_durable_step_of_a_run_is_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    commits: list[tuple[list[str], bool]] = []
    original = GroupCommit._apply_batch

    def watched(self: GroupCommit, conn: Any, batch: list[Any], *,
                force_durable: bool) -> None:
        original(self, conn, batch, force_durable=force_durable)
        commits.append(([write.what for write in batch], self._synchronous_full))

    monkeypatch.setattr(GroupCommit, "_apply_batch", watched)
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
                server, tmp_path / "home", exec_command=agent_command("reply.py", "hi")):
            run_id = await server.submit_run("work")
            await server.wait_until(finished(run_id))
    for step in DURABLE_STEPS:
        held = [full for whats, full in commits if step in whats]
        assert held, f"no commit held {step}: {commits}"
        assert all(held), f"{step} was committed without its fsync: {commits}"
