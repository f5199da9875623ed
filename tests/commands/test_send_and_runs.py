"""``prohost send --wait`` with no harness, Ctrl-C while waiting, ``prohost runs
show|cancel`` and a port in use (issue 31 point 11), all through the real command
line: ``prohost server`` and the client commands are subprocesses."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
import trio

from tests.kits.serverproc import (
    clean_env,
    prohost,
    quoted_commands,
    run_printed,
    server_process,
)

pytestmark = pytest.mark.protocol("§11")


async def test_waiting_with_no_harness_says_so_and_ctrl_c_says_the_run_goes_on() -> None:
    env = clean_env()
    with trio.fail_after(60):
        async with server_process("--no-state") as server:
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-m", "prohost", "send", "--server", server.http_url,
                 *server.state_flags, "--wait", "hello"],
                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE)
            assert proc.stdout is not None and proc.stderr is not None
            err = b""
            while b"no harness is connected" not in err:
                chunk = await proc.stderr.receive_some()
                assert chunk, f"send ended early: {err!r}"
                err += chunk
            assert b"still waiting" in err
            proc.send_signal(signal.SIGINT)
            while chunk := await proc.stderr.receive_some():
                err += chunk
            out = b""
            while chunk := await proc.stdout.receive_some():
                out += chunk
            assert await proc.wait() == 130
            run_id = out.decode().split()[0]
            said = err.decode()
            assert f"stopped waiting; run {run_id} goes on at the server (`" in said
            assert err.count(b"no harness is connected") == 1  # said once, not each poll
            # The commands it names run as printed: they look at and cancel that run.
            show, cancel = quoted_commands(said.split("stopped waiting")[1])

            shown = await run_printed(show, env)
            assert shown.returncode == 0, shown.stderr
            assert shown.stdout.decode().startswith(f"run {run_id}: queued\n")
            assert "  text: hello" in shown.stdout.decode()

            cancelled = await run_printed(cancel, env)
            assert cancelled.returncode == 0, cancelled.stderr
            assert cancelled.stdout.decode() == f"run {run_id} cancelled\n"
            as_json = await prohost("runs", "show", run_id, "--json", "--server",
                                    server.http_url, env=env)
            assert json.loads(as_json.stdout)["state"] == "cancelled"
            again = await prohost("runs", "cancel", run_id, "--server", server.http_url,
                                  *server.state_flags, env=env)
            assert again.returncode == 0  # cancelling twice is no error: it is cancelled
            assert again.stdout.decode() == f"run {run_id} cancelled\n"
            missing = await prohost("runs", "show", "run_nope", "--server", server.http_url,
                                    env=env)
            assert missing.returncode == 1
            assert b"404: no run run_nope" in missing.stderr

            # Its first characters name it, with or without run_ (issue 40, point 4);
            # characters two runs' ids start with list both, exit 2.
            short = run_id.removeprefix("run_")[:5]
            for typed in (short, "run_" + short):
                named = await prohost("runs", "show", typed, "--server", server.http_url,
                                      env=env)
                assert named.returncode == 0, named.stderr
                assert named.stdout.decode().startswith(f"run {run_id}: cancelled\n")
            other = (await prohost("send", "--server", server.http_url, *server.state_flags,
                                   "again", env=env)).stdout.decode().split()[0]
            both = await prohost("runs", "cancel", "run_", "--server", server.http_url,
                                 *server.state_flags, env=env)
            assert both.returncode == 2, both
            assert run_id.encode() in both.stderr and other.encode() in both.stderr
            assert server_run_state(await prohost("runs", "show", other, "--json",
                                                  "--server", server.http_url,
                                                  env=env)) == "queued"
            gone = await prohost("runs", "cancel", other.removeprefix("run_")[:6], "--server",
                                 server.http_url, *server.state_flags, env=env)
            assert gone.returncode == 0 and gone.stdout.decode() == f"run {other} cancelled\n"


def server_run_state(shown: subprocess.CompletedProcess[bytes]) -> str:
    state: str = json.loads(shown.stdout)["state"]
    return state


async def test_fail_without_harness_gives_up_and_leaves_the_run_queued() -> None:
    env = clean_env()
    with trio.fail_after(60):
        async with server_process("--no-state") as server:
            gave_up = await prohost("send", "--server", server.http_url, *server.state_flags,
                                    "--wait", "--fail-without-harness", "hello", env=env)
            assert gave_up.returncode == 3
            run_id = gave_up.stdout.decode().split()[0]
            assert f"so run {run_id} cannot start; it stays queued".encode() in gave_up.stderr
            shown = await prohost("runs", "show", run_id, "--json", "--server",
                                  server.http_url, env=env)
            assert json.loads(shown.stdout)["state"] == "queued"


async def test_a_port_in_use_suggests_port_0() -> None:
    with trio.fail_after(60):
        async with server_process("--no-state") as server:
            port = server.http_url.rsplit(":", 1)[1]
            second = await prohost("server", "--host", "127.0.0.1", "--port", port,
                                   "--no-state", env=clean_env())
    assert second.returncode == 1
    line = second.stderr.decode().strip()
    assert line.startswith(f"prohost server: cannot listen on 127.0.0.1:{port}: ")
    assert line.endswith("or give --port 0 to take any free port (the banner says which)")
