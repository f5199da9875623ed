"""Pairing keeps its promises (issue 31 point 4): it survives a restart of the
server (``--state DIR``, a 0600 file written atomically), a pairing code works once,
and ``agent pair`` never replaces the credentials of a harness running on the home.

Through the real command line: ``prohost server`` and ``prohost agent pair`` are
subprocesses; the harness that connects after the restart is the production one.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import httpx
import pytest
import trio

from prohost.engine.harness import Harness
from prohost.engine.link.connection import Endpoints
from prohost.home import load_credentials
from prohost.invocation import command
from prohost.options import Options
from prohost.server import ServerConfig, serve
from prohost.server.pairings import PAIRINGS_FILE
from tests.kits.harness import pair_home, running_server
from tests.kits.lockholder import start_holder, stop_holder
from tests.kits.process import harness_process
from tests.kits.serverproc import (
    clean_env,
    prohost,
    quoted_commands,
    run_printed,
    server_process,
)

pytestmark = pytest.mark.protocol("§10")


async def test_a_pairing_outlives_a_restart_and_a_code_works_once(tmp_path: Path) -> None:
    state, home, other = tmp_path / "state", tmp_path / "home", tmp_path / "other"
    with trio.fail_after(60):
        async with server_process("--state", str(state)) as server:
            assert f"pairings:     {state / PAIRINGS_FILE}" in "\n".join(server.banner)
            paired = await prohost("agent", "pair", "--code", server.code, "--url",
                                   server.ws_url, env=clean_env(home))
            assert paired.returncode == 0, paired.stderr
            again = await prohost("agent", "pair", "--code", server.code, "--url",
                                  server.ws_url, env=clean_env(other))
            assert again.returncode == 1
            assert b"used already" in again.stderr
            assert not (other / "credentials.json").exists()
            await server.wait_stderr("the next pairing code is")
        saved = state / PAIRINGS_FILE
        assert stat.S_IMODE(saved.stat().st_mode) == 0o600
        token = load_credentials(home).token
        assert [h["token"] for h in json.loads(saved.read_text())["harnesses"]] == [token]

        async with (
            server_process("--state", str(state)) as restarted,
            httpx.AsyncClient(base_url=restarted.http_url) as client,
        ):
            # A known token reaches the run lookup (404: no such run); an unknown
            # one is refused first (401) — what a harness would hear at the upgrade.
            answer = await client.post("/v1/agent/runs/run_x/complete", json={"ok": True},
                                       headers={"Authorization": f"Bearer {token}"})
            assert answer.status_code == 404, answer.text
            stranger = await client.post(
                "/v1/agent/runs/run_x/complete", json={"ok": True},
                headers={"Authorization": "Bearer pht_unknown"})
            assert stranger.status_code == 401


async def test_a_harness_reconnects_to_a_restarted_server_without_pairing(
    tmp_path: Path,
) -> None:
    """The production harness, with the credentials from before the restart."""
    state = tmp_path / "state"
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            first = await nursery.start(serve, ServerConfig(state_dir=state))
            async with httpx.AsyncClient(base_url=first.http_url) as client:
                answer = await client.post("/v1/agent/pair",
                                           json={"code": first.pairing_code, "machine": "m"})
            creds = answer.json()
            first.shutdown()
        async with running_server(state_dir=state) as second:
            assert creds["token"] in second.state.harnesses
            endpoints = Endpoints(ws_url=second.ws_url, api_base=second.http_url,
                                  token=creds["token"], secret=creds["secret"])
            options = Options(home=tmp_path / "home", machine="m", dry_run=True)
            async with httpx.AsyncHTTPTransport() as client, trio.open_nursery() as nursery:
                harness = Harness(options, endpoints, client=client, ledger=None)
                await nursery.start(harness.run)
                await second.wait_until(lambda s: s.connected > 0)
                nursery.cancel_scope.cancel()


async def test_pair_refuses_to_replace_a_running_harnesss_credentials(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with running_server() as server:
            pair_home(server, home)
            before = (home / "credentials.json").read_bytes()
            async with harness_process(server, home, "cat") as harness:
                pairings = len(server.state.harnesses)
                refused = await prohost("agent", "pair", "--code", server.pairing_code,
                                        "--url", server.ws_url, env=clean_env(home))
                assert refused.returncode == 2
                message = refused.stderr.decode()
                assert f"(pid {harness.proc.pid}) is running with PROHOST_HOME={home}" in message
                assert "the code is still unused" in message
                assert (home / "credentials.json").read_bytes() == before
                assert len(server.state.harnesses) == pairings  # the code was not spent
                # The advice names the next steps as commands that run as printed: a
                # second home paired with this very code (the placeholder folder
                # replaced, as a person would), then `agent stop` for the running one.
                stop, stop_now, pair_other, run_other = quoted_commands(message)
                assert (stop, stop_now) == (command("agent", "stop"),
                                            command("agent", "stop", "--now"))
                assert run_other == f"PROHOST_HOME=/some/other/dir {command('agent', 'run')} ..."
                other = tmp_path / "other"
                paired = await trio.run_process(
                    ["sh", "-c", pair_other.replace("/some/other/dir", str(other))],
                    env=clean_env(), check=False, capture_stdout=True, capture_stderr=True)
                assert paired.returncode == 0, paired.stderr
                assert (other / "credentials.json").exists()
                stopped = await run_printed(stop, clean_env(home))
                assert stopped.returncode == 0, stopped.stderr
                assert await harness.proc.wait() == 0  # it finished and exited
            # Stopped, the home can be paired again.
            allowed = await prohost("agent", "pair", "--code", server.pairing_code,
                                    "--url", server.ws_url, env=clean_env(home))
            assert allowed.returncode == 0, allowed.stderr
            assert (home / "credentials.json").read_bytes() != before


async def test_pair_refuses_while_a_gc_holds_the_home_and_says_so(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with running_server() as server:
            holder = start_holder(home, "gc")
            try:
                refused = await prohost("agent", "pair", "--code", server.pairing_code,
                                        "--url", server.ws_url, env=clean_env(home))
            finally:
                stop_holder(holder)
            assert refused.returncode == 2
            message = refused.stderr.decode()
            assert f"`{command('agent', 'gc')}` (pid {holder.pid}) is removing worktrees" in \
                message
            assert "pair again once it is done" in message
            assert not (home / "credentials.json").exists()


async def test_a_damaged_state_file_is_named_and_nothing_starts(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / PAIRINGS_FILE).write_text("{not json")
    with trio.fail_after(60):
        started = await prohost("server", "--port", "0", "--state", str(state),
                                env=clean_env(tmp_path / "home"))
    assert started.returncode == 1
    assert started.stdout == b""  # no banner: it never listened
    line = started.stderr.decode().strip()
    assert line.startswith(f"prohost server: error: {state / PAIRINGS_FILE} is damaged (")
    assert line.endswith("move it away to start with no pairings")


async def test_a_pairing_that_could_not_be_saved_leaves_its_code_unspent(
    tmp_path: Path,
) -> None:
    # Issue 37 point 11: the server answers 500, and the same code still pairs once
    # the state folder takes the file again.
    state = tmp_path / "state"
    with trio.fail_after(30):
        async with running_server(state_dir=state) as server, \
                httpx.AsyncClient(base_url=server.http_url) as client:
            code = server.pairing_code
            (state / PAIRINGS_FILE).mkdir(parents=True)  # the file cannot be replaced
            failed = await client.post("/v1/agent/pair", json={"code": code, "machine": "m"})
            assert failed.status_code == 500, failed.text
            assert server.pairing_code == code
            (state / PAIRINGS_FILE).rmdir()
            paired = await client.post("/v1/agent/pair", json={"code": code, "machine": "m"})
            assert paired.status_code == 200, paired.text
            assert [h.machine for h in server.state.harnesses.values()] == ["m"]
