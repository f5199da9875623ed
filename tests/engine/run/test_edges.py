"""Issue 37 point 11: small edges of recent features, each guarded through the real
harness and reference server (or the real command line) so that the breakage named
in each test fails it."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import trio

from prohost.engine.ledger import Ledger
from prohost.wire.runs import parse_body
from tests.kits.acp import acp_harness
from tests.kits.fake_clis import turn
from tests.kits.harness import finished, running_harness, running_server
from tests.kits.paths import logs_folder
from tests.kits.process import kill_leftovers, wait_gone

pytestmark = pytest.mark.protocol("§7")


async def test_an_acp_running_cost_that_went_down_is_never_a_negative_cost(
    tmp_path: Path,
) -> None:
    # The agent's session cost total restarts lower than what the lane last saw
    # (its own state lost): the run's share is then the total, never below 0.
    with trio.fail_after(60):
        async with acp_harness(tmp_path) as (_server, running):
            one = await turn(running, "turn 1")
            two = await turn(running, "turn 2")
            [state] = (logs_folder(tmp_path) / "sessions").glob("*.json")
            data = json.loads(state.read_text())
            data["cost"] = 0.0
            state.write_text(json.dumps(data))
            three = await turn(running, "turn 3")
    assert one["usage"]["cost_usd"] == two["usage"]["cost_usd"] == 0.25
    assert three["usage"]["cost_usd"] == 0.25, three["usage"]


@pytest.mark.protocol("§7")
async def test_a_restart_kills_every_group_of_the_run_not_only_the_recorded_one(
    tmp_path: Path,
) -> None:
    # Issue 37 point 11: the ledger names one live group of the run (an earlier
    # attempt's); a later attempt's, never recorded, lives on too. The /proc search
    # is made even while the recorded group is alive, and both are killed.
    home = tmp_path / "home"
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    agents: list[trio.Process] = []
    try:
        with trio.fail_after(60):
            async with running_server() as server:
                run_id = await server.submit_run("interrupted", conversation_id="C1")
                env = {**os.environ, "PROHOST_RUN_ID": run_id}
                agents = [await trio.lowlevel.open_process(
                    sleeper, env=env, start_new_session=True) for _ in range(2)]
                home.mkdir()
                with Ledger.open(home / "ledger.sqlite3") as ledger:
                    body = server.run(run_id).body_text
                    ledger.admit(run_id, parse_body(body).lane, body, time.time())
                    ledger.mark_started(run_id, time.time())
                    ledger.record_pgid(run_id, agents[0].pid)
                async with running_harness(server, home, exec_command="true"):
                    await server.wait_until(finished(run_id))
                for agent in agents:
                    assert await wait_gone(agent.pid), f"agent {agent.pid} outlived recovery"
    finally:
        kill_leftovers(agent.pid for agent in agents)
        with trio.CancelScope(shield=True):
            for agent in agents:
                await agent.wait()
