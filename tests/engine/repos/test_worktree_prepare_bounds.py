"""Preparing --repos worktrees within the run's bounds (§5.1): the run's deadline
bounds it, lanes queued behind a slow checkout wait for it instead of going
read-only, a cancel mid-checkout is repaired, and the state is `preparing`
meanwhile. Real git throughout; a slow checkout is one held on a fifo
(tests/kits/gitgate.py), never a sleep.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from prohost.engine.agent.brains.plain import PlainBrain
from prohost.engine.agent.process import ProcessGroups
from prohost.engine.repos.worktrees import WorktreeManager
from prohost.engine.run.execute import ExecSpec
from prohost.engine.run.heldrun import HeldRun
from prohost.wire.runs import AgentRun, Outcome
from tests.kits.gitgate import gate_checkouts, gate_post_checkout
from tests.kits.harness import agent_command, finished, running_harness, running_server
from tests.kits.repos import git, make_repo, only, worktree_paths
from tests.kits.runner import solo_runner

#: No git configuration of the machine reaches this module's repositories.
pytestmark = [pytest.mark.usefixtures("isolated_git"), pytest.mark.protocol("§5")]


# --- the run's deadline (issue 20, point 2) -----------------------------------------


async def test_a_checkout_slower_than_the_timeout_fails_the_run_without_the_agent(
    tmp_path: Path, mock_clock: trio.testing.MockClock,
) -> None:
    # Real time passes as well (rate 1), so fail_after still guards the test; the
    # deadline itself is passed with a jump, never waited for.
    mock_clock.rate = 1.0
    with trio.fail_after(400):
        source = await make_repo(tmp_path / "app")
        gate = gate_checkouts(source, tmp_path / "gate")
        manager = WorktreeManager(tmp_path / "home", [source])
        run = AgentRun(run_id="run_slow", completion_path="/c", text="hi", conversation_id="C1")
        held = HeldRun.of(run)
        progress = held.progress
        groups = ProcessGroups()
        outcome: list[Outcome] = []
        spec = ExecSpec(command=agent_command("reply.py", "done"), workdir=tmp_path / "work",
                        timeout_s=180, idle_timeout_s=0, parallel=False, secrets=())

        async with solo_runner(tmp_path / "solo", spec,
                               PlainBrain(agent_command("reply.py", "done")), groups=groups,
                               worktrees=manager) as solo:

            async def run_it() -> None:
                outcome.append(await solo.outcome(run, held=held))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(run_it)
                await gate.wait_started()  # `git worktree add` is checking out, held
                assert held.activity() == "preparing the private checkouts"
                mock_clock.jump(181)  # past the run's 3-minute --timeout
                await trio.testing.wait_all_tasks_blocked()
                # Let a checkout that outlived the deadline go on (there is none after
                # the fix: its git was killed), so the test ends either way.
                gate.release()
            row = solo.ledger.get("run_slow")
        (result,) = outcome
        assert not result.ok
        assert result.error == ("preparing the private checkouts took longer than the run's "
                                "3-minute limit (--timeout), so the agent was not started")
        # The agent was never started only to be killed: no group, none recorded.
        assert len(groups) == 0 and row is not None and row.pgid is None
        assert progress.attempts == 0 and progress.preparing is None
        assert not manager.source_lock(source).locked()
        # What the killed checkout left is cleared by the lane's next prepare.
        again = await manager.prepare("conv:C1")
        assert again.failures == ()
        assert (only(again.checkouts) / "slow.txt").read_text() == "slow\n"
        assert await git(only(again.checkouts), "status", "--porcelain") == ""


@pytest.mark.protocol("§2")
async def test_a_run_shows_preparing_while_its_checkout_is_made(tmp_path: Path) -> None:
    source = await make_repo(tmp_path / "code" / "app")
    gate = gate_checkouts(source, tmp_path / "gate")
    with trio.fail_after(60):
        async with running_server(heartbeat_s=0.2) as server, running_harness(
            server, tmp_path / "home", exec_command=agent_command("repo_agent.py"),
            repos=(source,),
        ) as running:
            run_id = await server.submit_run("work", conversation_id="C1")
            await gate.wait_started()
            # The server's view: the heartbeat says the run is preparing, and what.
            await server.wait_until(
                lambda s: (s.runs[run_id].last_beat or {}).get("state") == "preparing")
            beat = server.run(run_id).last_beat
            assert beat is not None
            assert beat["activity"] == "preparing the private checkouts"
            # The panel and `agent status` read the same held run.
            (held,) = running.harness.held.values()
            assert held.state == "preparing" and held.progress.attempts == 0
            assert gate.release()
            await server.wait_until(finished(run_id))
            completion = server.run(run_id).completion
            assert completion is not None and completion["ok"], completion


# --- lanes queued on one repository (issue 20, point 3) ------------------------------


async def test_a_lane_is_not_held_by_another_lane_s_slow_checkout(tmp_path: Path) -> None:
    """Each conversation's worktree is of a repository of its own (§13), so no
    lock of the person's repository holds one lane while another's checkout is
    slow: the second finishes while the first is still held."""
    with trio.fail_after(30):
        source = await make_repo(tmp_path / "app")
        gate = gate_checkouts(source, tmp_path / "gate")
        manager = WorktreeManager(tmp_path / "home", [source])
        results: dict[str, Path] = {}

        async def turn(lane: str) -> None:
            prepared = await manager.prepare(lane)
            assert prepared.failures == (), lane
            results[lane] = only(prepared.checkouts)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(turn, "conv:first")
            await gate.wait_started()  # the first lane's checkout is under way, held
            await turn("conv:second")
            assert set(results) == {"conv:second"}
            assert gate.release()
        assert set(results) == {"conv:first", "conv:second"}
        for path in results.values():
            assert (path / "slow.txt").read_text() == "slow\n"
            assert await git(path, "status", "--porcelain") == ""
        assert len(await worktree_paths(source, tmp_path / "home")) == 3


# --- a cancelled prepare (was wall-clock delays; now held on a fifo) ----------------


async def test_a_cancelled_prepare_is_repaired_by_the_next(tmp_path: Path) -> None:
    with trio.fail_after(30):
        files = {f"d{i % 10}/f{i}.txt": f"{i}\n" for i in range(100)}
        source = await make_repo(tmp_path / "app", files)
        manager = WorktreeManager(tmp_path / "home", [source])

        async def check(lane: str) -> None:
            prepared = await manager.prepare(lane)
            assert prepared.failures == ()
            path = only(prepared.checkouts)
            assert await git(path, "status", "--porcelain") == "", lane
            assert len(list((path / "d3").iterdir())) == 10
            assert not manager.source_lock(source).locked()

        # Cancelled before git runs at all.
        with trio.CancelScope() as scope:
            scope.cancel()
            await manager.prepare("conv:before")
        await check("conv:before")

        # Cancelled inside `git worktree add`, half-way through its checkout: git's
        # "initializing" lock and a partial tree are left behind.
        gate = gate_checkouts(source, tmp_path / "gate-mid")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(manager.prepare, "conv:mid")
            await gate.wait_started()
            nursery.cancel_scope.cancel()
        lane_repo = manager.lane_folder("conv:mid") / ".prohost-repos" / "app.git"
        assert "initializing" in await git(lane_repo, "--git-dir", str(lane_repo),
                                           "worktree", "list", "--porcelain")
        await check("conv:mid")

        # A post-checkout hook would hold it here, but the harness's git runs no
        # hook (§13: hooks are files a run may have written), so none waits.
        gate_post_checkout(source, tmp_path / "gate-after")
        await check("conv:after")
        assert not (tmp_path / "gate-after" / "taken").exists()

