"""Issue 31 point 3 as a person meets it, every part a real process: `prohost
server`, `prohost agent pair`, `prohost agent run`, `prohost send` and `prohost
runs show`. A run queued behind a busy one is handed back "not started" when the
harness is stopped with Ctrl-C; the server submits it again, and the same home's
next harness runs it. Nothing is lost."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from tests.kits.harness import Gate
from tests.kits.process import HarnessProcess, kill_leftovers
from tests.kits.serverproc import (
    ServerProcess,
    clean_env,
    prohost,
    quoted_commands,
    run_printed,
    server_process,
    without_prohost_on_path,
)

pytestmark = pytest.mark.protocol("§9", "§11")


async def start_harness(nursery: trio.Nursery, home: Path, gate: Gate) -> HarnessProcess:
    """``prohost agent run`` on ``home`` whose agents are the Gate's; killed (with its
    agents) when ``nursery`` ends, however the test ends."""
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "prohost", "agent", "run", "--exec", gate.command,
         "--concurrency", "1", "--machine", "t", "--no-panel"],
        env=clean_env(home), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE)
    harness = HarnessProcess(proc)
    nursery.start_soon(harness.read_log)

    async def kill_at_the_end() -> None:
        try:
            await trio.sleep_forever()
        finally:
            if proc.returncode is None:
                proc.kill()
            kill_leftovers(gate.pids.values())
            with trio.CancelScope(shield=True):
                await proc.wait()

    nursery.start_soon(kill_at_the_end)
    return harness


async def send(server: ServerProcess, text: str, conversation: str) -> str:
    sent = await prohost("send", "--server", server.http_url, *server.state_flags,
                         "--conversation", conversation, text, env=clean_env())
    assert sent.returncode == 0, sent.stderr
    return sent.stdout.decode().strip()


async def test_a_run_handed_back_at_ctrl_c_runs_after_the_restart(tmp_path: Path) -> None:
    home = tmp_path / "home"
    gate = Gate()
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery, server_process(
            "--state", str(tmp_path / "state")
        ) as server:
            await nursery.start(gate.serve)
            paired = await prohost("agent", "pair", "--code", server.code, "--url",
                                   server.ws_url, env=clean_env(home))
            assert paired.returncode == 0, paired.stderr

            first = await start_harness(nursery, home, gate)
            await server.wait_stderr("harness t connected (connection 1)")
            busy = await send(server, "long job", "A")
            await gate.wait_started(busy)
            queued = await send(server, "waiting behind it", "B")
            await first.wait_log("queued: 1")  # the panel's plain line: accepted, waiting
            first.send_signal(signal.SIGINT)
            retry_line = await server.wait_stderr(f"run {queued} failed retryable")
            retry = retry_line.split(" retrying it as ")[1].split()[0]
            await gate.release(busy)
            assert await first.wait_clean_exit() == 0

            second = await start_harness(nursery, home, gate)
            await gate.wait_started(retry)
            await gate.release(retry, "done after all")
            await server.wait_stderr(f"run {retry} completed")
            second.send_signal(signal.SIGINT)
            assert await second.wait_clean_exit() == 0

            shown = await prohost("runs", "show", queued, "--server", server.http_url,
                                  env=clean_env())
            text = shown.stdout.decode()
            assert f"run {queued}: failed" in text
            assert "error: the agent is shutting down; the run was not started" in text
            # The command named for the retry runs as printed (no prohost on PATH).
            retried = next(line for line in text.splitlines() if "retried as" in line)
            assert retried.startswith(f"  retried as {retry} (the failure was retryable): ")
            again = await run_printed(retried.split("retryable): ", 1)[1],
                                      without_prohost_on_path(clean_env()))
            assert again.stdout.decode().startswith(f"run {retry}: completed\n"), again
            assert f"retry of: {queued}" in again.stdout.decode()
            assert "done after all" in again.stdout.decode()
            nursery.cancel_scope.cancel()


async def test_cancelling_a_running_run_names_a_show_that_runs_as_printed(
    tmp_path: Path
) -> None:
    # `runs cancel` of a run its harness is running says the cancel is sent and
    # which command tells when it has ended: run as printed (no prohost on PATH),
    # it shows the run cancelled once the harness has stopped it.
    home = tmp_path / "home"
    gate = Gate()
    env = without_prohost_on_path(clean_env())
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery, server_process(
            "--state", str(tmp_path / "state")
        ) as server:
            await nursery.start(gate.serve)
            paired = await prohost("agent", "pair", "--code", server.code, "--url",
                                   server.ws_url, env=clean_env(home))
            assert paired.returncode == 0, paired.stderr
            await start_harness(nursery, home, gate)
            await server.wait_stderr("harness t connected (connection 1)")
            busy = await send(server, "long job", "A")
            await gate.wait_started(busy)
            cancel = await prohost("runs", "cancel", busy, "--server", server.http_url,
                                   *server.state_flags, env=clean_env())
            said = cancel.stdout.decode()
            assert said.startswith(f"run {busy}: cancel sent"), said
            [show] = quoted_commands(said)
            await server.wait_stderr(f"run {busy} failed")  # its report came
            shown = await run_printed(show, env)
            text = shown.stdout.decode()
            assert text.startswith(f"run {busy}: failed\n"), shown
            assert "error: cancelled: " in text and "is stopping it" not in text
            nursery.cancel_scope.cancel()
