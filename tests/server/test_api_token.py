"""The reference server's people's API requires its token (issue 40, point 14).

``POST /v1/runs``, ``DELETE /v1/runs/<id>`` and the fault hooks were open to every
local process, a confined agent run included: a run could submit runs into other
conversations. Now each needs ``Authorization: Bearer <token>``, a token the server
writes at each start to ``api-token`` in its state folder (0600), where ``prohost
send`` reads it; a confined run cannot read it (the state folder is in
``$PROHOST_HOME``, which runs never see), so its requests are refused 401. The
harness's own routes (``/v1/agent/…``) are unchanged.
"""

from __future__ import annotations

import shlex
import stat
import sys
from pathlib import Path

import httpx
import pytest
import trio

from prohost.server.apitoken import API_TOKEN_FILE
from tests.kits.confinement import World, world_fixture  # noqa: F401 (the fixture)
from tests.kits.full_confinement import NEEDS_FULL_CONFINEMENT
from tests.kits.harness import api_headers, finished, running_server
from tests.kits.paths import AGENTS
from tests.kits.serverproc import clean_env, prohost, server_process

pytestmark = pytest.mark.protocol("§11")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_what_changes_runs_needs_the_token_and_reads_do_not(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with trio.fail_after(20):
        async with (
            running_server(state_dir=state, faults=True) as server,
            httpx.AsyncClient(base_url=server.http_url) as client,
        ):
            mine = await server.submit_run("mine", conversation_id="C1")
            harness_token = server.pair("studio")["token"]
            body = {"conversation_id": "C2", "text": "from a stranger"}
            refused = {
                "bare": await client.post("/v1/runs", json=body),
                "forged": await client.post("/v1/runs", json=body,
                                            headers={"Authorization": "Bearer phs_forged"}),
                # A harness's own token opens the harness's routes, not this API.
                "harness's": await client.post(
                    "/v1/runs", json=body,
                    headers={"Authorization": f"Bearer {harness_token}"}),
                "cancel": await client.delete(f"/v1/runs/{mine}"),
                "fault": await client.post("/v1/faults/drop"),
            }
            read = await client.get(f"/v1/runs/{mine}")
            allowed = await client.post("/v1/runs", json=body, headers=api_headers(server))
            cancelled = await client.delete(f"/v1/runs/{mine}", headers=api_headers(server))
    token_file = state / API_TOKEN_FILE
    assert {name: answer.status_code for name, answer in refused.items()} == dict.fromkeys(
        refused, 401)
    error = refused["bare"].json()["error"]
    assert error.startswith("submitting a run needs the server's API token: send "
                            "'Authorization: Bearer <token>' with the token this server "
                            f"wrote to {token_file}")
    assert f"give them --state {state}" in error
    assert read.status_code == 200 and allowed.status_code == 201
    assert cancelled.status_code == 200
    # Nothing a refused request asked for happened.
    assert [run.conversation_id for run in server.state.runs.values()] == ["C1", "C2"]
    assert server.state.faults.view(0)["drops"] == 0
    assert token_file.read_text() == server.api_token + "\n"
    assert (mode(token_file), mode(state)) == (0o600, 0o700)


async def test_send_reads_the_token_from_the_servers_state_and_a_restart_makes_a_new_one(
    tmp_path: Path,
) -> None:
    home, stranger = tmp_path / "home", tmp_path / "elsewhere"
    env = clean_env(home)
    with trio.fail_after(60):
        async with server_process(env=env) as server:
            # The default state folder, $PROHOST_HOME/server: send finds it alone.
            assert server.token_file == home / "server" / API_TOKEN_FILE
            first_token = server.token_file.read_text().strip()
            sent = await prohost("send", "--server", server.http_url, "hello", env=env)
            assert sent.returncode == 0, sent.stderr
            lost = await prohost("send", "--server", server.http_url, "hello",
                                 env=clean_env(stranger))
            async with httpx.AsyncClient(base_url=server.http_url) as client:
                listed = (await client.get("/v1/runs")).json()["runs"]
        async with server_process(env=env) as restarted:
            second_token = restarted.token_file.read_text().strip()
            async with httpx.AsyncClient(base_url=restarted.http_url) as client:
                stale = await client.post("/v1/runs", json={"text": "x"}, headers={
                    "Authorization": f"Bearer {first_token}"})
            again = await prohost("send", "--server", restarted.http_url, "hello", env=env)
    assert [run["run_id"] for run in listed] == [sent.stdout.decode().strip()]
    assert lost.returncode == 1 and lost.stdout == b""
    assert lost.stderr.decode() == (
        f"prohost send: there is no API token at {stranger / 'server' / API_TOKEN_FILE}: no "
        f"reference server has run with the state folder {stranger / 'server'}; start one, "
        "or name the folder its banner names with --state\n")
    assert first_token != second_token and stale.status_code == 401
    assert again.returncode == 0, again.stderr


@NEEDS_FULL_CONFINEMENT
async def test_a_confined_run_can_neither_read_the_token_nor_submit_nor_cancel(
    world: World,
) -> None:
    """A hostile agent through the real harness, with a person's layout: the server
    keeps its state in the harness's home, as ``prohost server`` does by default."""
    state = world.home / "server"
    token_file = state / API_TOKEN_FILE
    with trio.fail_after(60):
        async with running_server(state_dir=state) as server:
            intruder = shlex.join([sys.executable, str(AGENTS / "api_intruder.py"),
                                   server.http_url, str(token_file)])
            async with world.harness(server, intruder):
                run_id = await server.submit_run("intrude", conversation_id="mine")
                await server.wait_until(finished(run_id))
            run = server.run(run_id)
    assert run.completion is not None and run.completion["ok"] is True, run.completion
    said = dict(line.split("=", 1) for line in run.completion["reply"].splitlines())
    assert said["read0"] in ("ENOENT", "EACCES")  # the token file is out of its sight
    assert "submit_read0" not in said  # it read no token to try
    assert {name: said[name] for name in ("submit_none", "submit_forged", "cancel_none",
                                          "cancel_forged")} == dict.fromkeys(
        ("submit_none", "submit_forged", "cancel_none", "cancel_forged"), "401")
    # Judged by the server: no run was added, the run was not cancelled.
    assert list(server.state.runs) == [run_id]
    assert run.state == "completed" and not run.cancel_requested
    assert token_file.read_text().strip() == server.api_token  # it was there all along
