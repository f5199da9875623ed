"""Issue 37: a run whose agent has finished is finished (§6). A cancel that comes
after the agent printed its reply and exited, while the harness still gives what
the agent left in its process group the grace to end, changes nothing: the run is
reported with its reply.

Real parts: the reference server on 127.0.0.1, the production harness in this trio
run (confined as by default), a real agent process whose child holds its group
open (``lingering_rest.py``); the child tells the test's Gate when the harness's
SIGTERM reaches it, which is the moment the window is open.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from prohost.engine.run import workspace as workspace_module
from prohost.engine.run.staging import share_login
from tests.kits.accounts import folders, limit
from tests.kits.endings import CANCELLED, cancel_run, handled
from tests.kits.fake_clis import FAKE_CLAUDE, claude_env, invocations
from tests.kits.harness import Gate, agent_command, finished, running_harness, running_server

pytestmark = pytest.mark.protocol("§6")


async def test_a_cancel_after_the_agent_exited_with_its_reply_keeps_the_reply(
    tmp_path: Path,
) -> None:
    gate = Gate()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(gate.serve)
            async with running_server() as server, running_harness(
                    server, tmp_path / "home",
                    exec_command=agent_command("lingering_rest.py", gate.port, "all done"),
            ) as running:
                # The window stays open until the test closes it (the child's end).
                running.harness.groups.grace_s = 60
                run_id = await server.submit_run("work")
                # The agent has exited with its reply; its child got the SIGTERM.
                await gate.wait_started(f"{run_id}-rest")
                await cancel_run(server, run_id)
                await handled(server, "after-cancel")
                await gate.release(f"{run_id}-rest")
                await server.wait_until(finished(run_id))
            nursery.cancel_scope.cancel()
    completion = server.run(run_id).completion
    assert completion is not None
    assert (completion["ok"], completion["reply"]) == (True, "all done"), completion


@pytest.mark.protocol("§12")
async def test_a_cancel_after_a_limited_agent_exited_stops_the_fail_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Account a is at its limit: its agent exits saying so, and the run would go on
    # on account b. A cancel that comes after a's agent exited (here: while the
    # harness copies a's login back) is kept, and stops the run before b's agent
    # starts: only a run whose agent finished is finished.
    accounts = folders(tmp_path, "a", "b")
    limit(dict(accounts)["a"], time.time() + 3600)
    shared: list[object] = []
    reached, go_on = trio.Event(), trio.Event()

    async def held_back(*args: object, **kwargs: object) -> None:
        shared.append(args)
        if len(shared) == 2:  # after a's attempt: its agent has exited
            reached.set()
            await go_on.wait()
        await share_login(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(workspace_module, "share_login", held_back)
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
                server, tmp_path / "home", exec_command=FAKE_CLAUDE, brain="claude",
                env=claude_env(tmp_path), accounts=accounts):
            run_id = await server.submit_run("go on", conversation_id="C1")
            await reached.wait()
            await cancel_run(server, run_id)
            await handled(server, "after-cancel")
            go_on.set()
            await server.wait_until(finished(run_id))
    completion = server.run(run_id).completion
    assert completion is not None
    assert (completion["error"], completion["retryable"]) == (CANCELLED, False), completion
    # Ended on a: no agent was spawned on b (it would be the run's account then).
    assert completion["account"] == "a", completion
    assert [Path(i["login_dir"]).name for i in invocations(tmp_path)] == ["cfg-a"]
