"""Issue 37: every ending tells the whole truth (§6, §7, §9).

A cancel stays cancelled whatever follows (a second signal, a kill -9 and a
restart), the reference server never runs a cancelled request again, a cancelled or
stopped run carries its ``changes``, ``duration_ms`` and ``usage`` like every other
completion, and a run whose agent had already finished is reported finished.

Real parts: the reference server on 127.0.0.1, the production harness (in this trio
run, or as a ``python -m prohost agent run`` subprocess), real git and sqlite; the
agents are the test's gated fakes (``deaf.py`` ignores SIGTERM, so the stop after a
cancel lasts until its SIGKILL).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from prohost.engine.ledger import RunState
from prohost.engine.run.checkouts import LaneCheckouts
from prohost.wire.outcomes import STOPPED
from tests.kits import no_sandbox
from tests.kits.endings import CANCELLED, cancel_run, handled
from tests.kits.harness import (
    Gate,
    agent_command,
    finished,
    running_harness,
    running_server,
    start_run,
)
from tests.kits.process import harness_process, kill_harness, ledger_row, paired_with_gate
from tests.kits.repos import make_readme_repo

pytestmark = pytest.mark.protocol("§6")







async def test_a_second_signal_after_a_cancel_keeps_it_cancelled_and_not_retried(
    tmp_path: Path,
) -> None:
    # Point 1: the agent ignores SIGTERM, the server cancels, then Ctrl-C twice.
    gate = Gate()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(gate.serve)
            async with running_server(retries=3, retry_first_s=0.01) as server, \
                    running_harness(server, tmp_path / "home",
                                    exec_command=agent_command("deaf.py", gate.port)) as running:
                run_id = await start_run(server, gate, "work")
                await cancel_run(server, run_id)
                await handled(server, "after-cancel")  # the agent is deaf to its TERM
                running.harness.drain()
                running.harness.stop()
                await server.wait_until(finished(run_id))
                assert await running.wait_exit() == 130
            nursery.cancel_scope.cancel()
    completion = server.run(run_id).completion
    assert completion is not None
    assert (completion["error"], completion["retryable"]) == (CANCELLED, False)
    assert server.run(run_id).retried_as is None
    assert gate.started == [run_id]


async def test_a_cancelled_and_a_stopped_run_carry_their_changes_and_duration(
    tmp_path: Path,
) -> None:
    # Point 3: the agent committed on its conversation's branch before the cancel.
    app = await make_readme_repo(tmp_path / "code" / "app")
    gate = Gate()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(gate.serve)
            async with running_server() as server, running_harness(
                    server, tmp_path / "home", exec_command=agent_command("deaf.py", gate.port),
                    repos=(app,), concurrency=2) as running:
                running.harness.groups.grace_s = 0.5  # the SIGKILL comes sooner
                cancelled = await start_run(server, gate, "work", conversation_id="A")
                stopped = await start_run(server, gate, "work", conversation_id="B")
                await cancel_run(server, cancelled)
                await server.wait_until(finished(cancelled))
                running.harness.drain()
                running.harness.stop()
                await server.wait_until(finished(stopped))
            nursery.cancel_scope.cancel()
    for run_id, error, retryable in ((cancelled, CANCELLED, False), (stopped, STOPPED, True)):
        completion = server.run(run_id).completion
        assert completion is not None
        assert (completion["error"], completion["retryable"]) == (error, retryable)
        assert isinstance(completion.get("duration_ms"), int), completion
        [entry] = completion["changes"]
        assert entry["commits"] == 1
        assert entry["files"] == [{"path": f"work-{run_id}.txt", "change": "added",
                                   "added": 1, "removed": 0, "committed": True}]


@pytest.mark.protocol("§7")
async def test_a_cancel_after_the_agent_finished_keeps_the_reply(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Point 3: the cancel comes while the harness reads what the finished run changed.
    app = await make_readme_repo(tmp_path / "code" / "app")
    reading = trio.Event()
    go_on = trio.Event()
    original: Callable[[LaneCheckouts], Awaitable[Any]] = LaneCheckouts.changes

    async def held_back(self: LaneCheckouts) -> Any:
        reading.set()
        await go_on.wait()
        return await original(self)

    monkeypatch.setattr(LaneCheckouts, "changes", held_back)
    gate = Gate()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(gate.serve)
            async with running_server() as server, running_harness(
                    server, tmp_path / "home", exec_command=agent_command("deaf.py", gate.port),
                    repos=(app,)):
                run_id = await start_run(server, gate, "work")
                await gate.release(run_id, "all done")
                await reading.wait()
                await cancel_run(server, run_id)
                await handled(server, "after-cancel")
                go_on.set()
                await server.wait_until(finished(run_id))
            nursery.cancel_scope.cancel()
    completion = server.run(run_id).completion
    assert completion is not None
    assert (completion["ok"], completion["reply"]) == (True, "all done"), completion
    assert completion["changes"][0]["commits"] == 1


@pytest.mark.protocol("§7")
async def test_a_cancel_survives_a_kill_during_its_stop_and_is_never_run_again(
    tmp_path: Path,
) -> None:
    # Point 2: cancel, kill -9 the harness while the deaf agent is being stopped,
    # restart: the run is reported cancelled, and nothing runs it again.
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with paired_with_gate(home, retries=3, retry_first_s=0.01) as (gate, server):
            command = agent_command("deaf.py", gate.port)
            async with harness_process(server, home, command) as first:
                run_id = await start_run(server, gate, "work")
                await cancel_run(server, run_id)
                # The cancel is durable before the agent is stopped (§6); the
                # deaf agent then outlives the SIGTERM, and the harness dies now.
                await first.wait_log(f"run {run_id}: its cancel is kept")
                await kill_harness(server, first)
            row = ledger_row(home, run_id)
            assert row.state is RunState.STARTED and row.outcome is not None
            async with harness_process(server, home, command):
                await server.wait_until(finished(run_id))
            completion = server.run(run_id).completion
            assert completion is not None
            assert (completion["error"], completion["retryable"]) == (CANCELLED, False)
            # From its start until the restart found it (§7: every ending says it).
            assert completion["duration_ms"] > 0
            assert server.run(run_id).retried_as is None
            assert gate.started == [run_id]



@pytest.mark.protocol("§13")
async def test_a_runs_folder_is_private_even_in_a_widened_home(tmp_path: Path) -> None:
    # Point 8: the home widened to 0755 beforehand (a chmod, a restored backup) and
    # a umask of 022: everything the harness makes for a run is the user's alone.
    # Without bubblewrap (Landlock alone), where a plain run's TMPDIR is a folder
    # the harness makes in the run's scratch folder (bubblewrap's is in memory).
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with paired_with_gate(home) as (gate, server):
            home.chmod(0o755)
            for folder in ("runs", "stderr"):
                (home / folder).mkdir(mode=0o755, exist_ok=True)
                (home / folder).chmod(0o755)
            old_umask = os.umask(0o022)
            try:
                async with harness_process(server, home, gate.command,
                                           program=no_sandbox.program("bwrap")):
                    run_id = await start_run(server, gate, "work")
                    made = {str(path.relative_to(home)): stat.S_IMODE(path.lstat().st_mode)
                            for path in [home / "runs", *(home / "runs").rglob("*")]}
                    await gate.fail(run_id, 1)  # its stderr is kept, in stderr/
                    await server.wait_until(finished(run_id))
                    kept = {str(path.relative_to(home)): stat.S_IMODE(path.lstat().st_mode)
                            for path in [home / "stderr", *(home / "stderr").rglob("*")]}
            finally:
                os.umask(old_umask)
    assert len(made) > 1, "the run made no folder of its own"
    assert len(kept) > 1, "the run's stderr was not kept"
    made.update(kept)
    assert {path: oct(mode) for path, mode in made.items() if mode & 0o077} == {}


@pytest.mark.protocol("§13")
async def test_a_confinement_that_could_not_be_made_here_is_retryable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Point 7: nothing ran and the fault is this machine's (here: the rules could
    # not be made, EIO): another try, here or elsewhere, may well work.
    from prohost.engine.run import confine

    def failing_disk(policy: object, support: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(confine, "prepare", failing_disk)
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
                server, tmp_path / "home", exec_command=agent_command("reply.py", "hi")):
            run_id = await server.submit_run("work")
            await server.wait_until(finished(run_id))
    completion = server.run(run_id).completion
    assert completion is not None
    assert completion["error"].startswith("the agent could not be confined"), completion
    assert completion["retryable"] is True
