"""Issue 37 (36.7): an agent whose start never completes — its ``--exec`` program
blocks opening a named pipe before it execs the agent, deaf to SIGTERM — is bounded
by the run's cancel and by its deadline, reported, and leaves no process behind.

Real parts: the reference server on 127.0.0.1, the production harness in this trio
run, spawning confined through its one spawn path (under bubblewrap where the
machine has it), a real FIFO in a folder the run may see; the program tells the
test's Gate it started just before it blocks. No switch of the harness's is set.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from prohost.wire.outcomes import ran_too_long
from tests.kits.endings import CANCELLED, cancel_run
from tests.kits.harness import (
    Gate,
    agent_command,
    finished,
    running_harness,
    running_server,
    start_run,
)
from tests.kits.paths import logs_folder
from tests.kits.process import kill_leftovers, wait_gone

pytestmark = pytest.mark.protocol("§6", "§7")


def _hung_command(tmp_path: Path, port: int) -> str:
    """The ``--exec`` line: the hanging wrapper, then the agent it never reaches."""
    fifo = logs_folder(tmp_path) / "never-written"
    fifo.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(fifo)
    return agent_command("hung_before_exec.py", port, fifo, "/bin/echo", "never")


@pytest.mark.parametrize("ended_by", ["cancel", "deadline"])
async def test_an_agent_that_never_gets_to_exec_is_bounded_and_leaves_nothing(
    tmp_path: Path, ended_by: str,
) -> None:
    gate = Gate()
    timeout_s = 1.0 if ended_by == "deadline" else 0.0
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(gate.serve)
            try:
                async with running_server() as server, running_harness(
                        server, tmp_path / "home", timeout_s=timeout_s,
                        exec_command=_hung_command(tmp_path, gate.port)) as running:
                    running.harness.groups.grace_s = 0.5  # deaf to SIGTERM: SIGKILL soon
                    run_id = await start_run(server, gate, "work")
                    if ended_by == "cancel":
                        await cancel_run(server, run_id)
                    await server.wait_until(finished(run_id))
                    assert await wait_gone(gate.pids[run_id]), "the hung program lives on"
                    assert len(running.harness.groups) == 0, "a process group is left"
            finally:
                kill_leftovers(gate.pids.values())
            nursery.cancel_scope.cancel()
    completion = server.run(run_id).completion
    assert completion is not None
    if ended_by == "cancel":
        assert (completion["error"], completion["retryable"]) == (CANCELLED, False)
    else:
        assert completion["error"] == ran_too_long(timeout_s), completion
    assert completion["confined"] is True
