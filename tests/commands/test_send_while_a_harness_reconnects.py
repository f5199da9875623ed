"""``prohost send --wait`` after the server restarted (issue 40, point 13).

A harness dials a restarted server again on its own, at most 30 s apart; meanwhile
none is connected, and ``send`` said "no harness is connected … (start one with
`prohost agent run`)" to a person whose harness was running. The server now keeps
when each harness was last connected (in its state folder, across restarts) and
whether it went on purpose; ``send`` says one is expected back and waits, and
gives the "start one" advice only when none is. Real processes throughout: the
server restarted on the same state, ``agent pair``, ``agent run``, ``send``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from prohost.invocation import command
from tests.kits.serverproc import clean_env, prohost, quoted_commands, server_process

pytestmark = pytest.mark.protocol("§11")


async def free_port() -> int:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port: int = listener.socket.getsockname()[1]
    await listener.aclose()
    return port


async def start_harness(env: dict[str, str]) -> trio.Process:
    return await trio.lowlevel.open_process(
        [sys.executable, "-m", "prohost", "agent", "run", "--exec", "cat", "--machine", "t"],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)


async def stderr_until(proc: trio.Process, text: bytes) -> bytes:
    assert proc.stderr is not None
    err = b""
    while text not in err:
        chunk = await proc.stderr.receive_some()
        assert chunk, f"it ended before saying {text!r}: {err!r}"
        err += chunk
    return err


async def test_send_says_a_harness_is_expected_back_after_a_restart(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = clean_env(home)
    harness: trio.Process | None = None
    try:
        with trio.fail_after(120):
            port = await free_port()
            async with server_process("--port", str(port), env=env) as server:
                paired = await prohost("agent", "pair", "--code", server.code, "--url",
                                       server.ws_url, "--machine", "studio", env=env)
                assert paired.returncode == 0, paired.stderr
                harness = await start_harness(env)
                await server.wait_stderr("harness t connected (connection 1)")
            # The same state, on another port: the harness keeps dialling the old one
            # (as it does while a restarted server comes up), so it stays away.
            async with server_process(env=env) as restarted:
                waiting = await trio.lowlevel.open_process(
                    [sys.executable, "-m", "prohost", "send", "--server",
                     restarted.http_url, "--wait", "--fail-without-harness", "hello"],
                    env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE)
                said = await stderr_until(waiting, b"expected back")
                # It waits (even with --fail-without-harness: one is coming).
                assert waiting.returncode is None
                waiting.send_signal(signal.SIGINT)
                assert await waiting.wait() == 130
    finally:
        if harness is not None:
            if harness.returncode is None:
                harness.kill()
            with trio.CancelScope(shield=True):
                await harness.wait()

    line = said.decode()
    assert "no harness is connected to the server right now, but studio was connected" in line
    assert "s ago and is expected back" in line
    assert "start one" not in line and "agent run" not in line


async def test_a_server_never_connected_to_says_start_one(tmp_path: Path) -> None:
    env = clean_env(tmp_path / "home")
    with trio.fail_after(60):
        async with server_process(env=env) as server:
            waiting = await trio.lowlevel.open_process(
                [sys.executable, "-m", "prohost", "send", "--server", server.http_url,
                 "--wait", "hello"],
                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE)
            said = (await stderr_until(waiting, b"still waiting")).decode()
            waiting.send_signal(signal.SIGINT)
            assert await waiting.wait() == 130
    assert "no harness is connected to the server: run" in said
    assert "expected back" not in said
    # The command it names is this program's, runnable as printed.
    assert quoted_commands(said) == [command("agent", "run")]


async def test_a_harness_stopped_on_purpose_is_not_expected_back(tmp_path: Path) -> None:
    # `agent stop` drains and exits: the harness closes its socket with a close
    # frame (1000), which the server reads as "left on purpose". Dropped without
    # one, it looked like a lost connection and `send` said it was expected back
    # for 90 s; now `--fail-without-harness` gives up at once with the advice.
    home = tmp_path / "home"
    env = clean_env(home)
    harness: trio.Process | None = None
    try:
        with trio.fail_after(60):
            async with server_process(env=env) as server:
                paired = await prohost("agent", "pair", "--code", server.code, "--url",
                                       server.ws_url, "--machine", "studio", env=env)
                assert paired.returncode == 0, paired.stderr
                harness = await start_harness(env)
                await server.wait_stderr("harness t connected (connection 1)")
                stopped = await prohost("agent", "stop", env=env)
                assert stopped.returncode == 0, stopped.stderr
                assert await harness.wait() == 0
                await server.wait_stderr("harness t disconnected (connection 1)")
                with trio.fail_after(15):  # at once: not the 90 s of one expected back
                    sent = await prohost("send", "--server", server.http_url, "--wait",
                                         "--fail-without-harness", "hello", env=env)
    finally:
        if harness is not None and harness.returncode is None:
            harness.kill()
            with trio.CancelScope(shield=True):
                await harness.wait()

    said = sent.stderr.decode()
    assert sent.returncode == 3, said
    assert "expected back" not in said
    assert f"`{command('agent', 'run')}` starts a harness" in said
