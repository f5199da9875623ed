"""Finding a previous harness's agent at restart (prohost.engine.agent.procinfo, §7),
with real processes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

import pytest
import trio

from prohost.engine.agent import procinfo
from prohost.engine.agent.procinfo import process_belongs_to_run

pytestmark = pytest.mark.protocol("§7")


async def _read_line(stream: trio.abc.ReceiveStream) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = await stream.receive_some()
        if not chunk:
            break
        data += chunk
    return data


def _env(run_id: str | None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "PROHOST_RUN_ID"}
    if run_id is not None:
        env["PROHOST_RUN_ID"] = run_id
    return env


# Waits for stdin to close, so the test decides when it ends without any sleep.
WAIT_FOR_STDIN = [sys.executable, "-c", "import sys; sys.stdin.read()"]


async def _belongs(pgid: int, run_id: str) -> bool:
    return await trio.to_thread.run_sync(process_belongs_to_run, pgid, run_id)


@asynccontextmanager
async def session_leader(env: dict[str, str]) -> AsyncIterator[trio.Process]:
    """A child that leads a new session and process group, with ``env``, alive until
    the block ends; it is reaped then, whether the test passed, failed or was cancelled."""
    process = await trio.lowlevel.open_process(
        WAIT_FOR_STDIN, start_new_session=True, stdin=subprocess.PIPE, env=env
    )
    try:
        yield process
    finally:
        with trio.CancelScope(shield=True):
            if process.stdin is not None:
                await process.stdin.aclose()  # it ends once its stdin closes
            with trio.move_on_after(10):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()


async def test_belongs_only_to_a_live_group_carrying_the_run_id() -> None:
    with trio.fail_after(30):
        async with session_leader(_env("run-1")) as process:
            assert os.getpgid(process.pid) == process.pid
            assert await _belongs(process.pid, "run-1")
            assert not await _belongs(process.pid, "run-2")
            assert not await _belongs(process.pid, "run-")  # a prefix is not a match
        assert process.returncode == 0
        # Reaped: the group is gone, so its number means nothing any more.
        assert not await _belongs(process.pid, "run-1")


async def test_a_recycled_group_without_the_run_id_does_not_belong() -> None:
    with trio.fail_after(30):
        async with session_leader(_env(None)) as process:
            assert not await _belongs(process.pid, "run-1")


async def test_the_group_still_belongs_after_its_leader_exits() -> None:
    """An agent's children can outlive it; they carry the run id too and must be killed."""
    # The grandchild says "up" once it runs: before that it may still be in execve,
    # with no environment to show yet (this test used to flake on a loaded machine).
    leader_code = (
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import sys; print(\"up\", flush=True); sys.stdin.read()'])\n"
        "print(child.pid, flush=True)\n"
    )
    with trio.fail_after(30):
        leader = await trio.lowlevel.open_process(
            [sys.executable, "-c", leader_code],
            start_new_session=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=_env("run-7"),
        )
        pgid = leader.pid
        try:
            assert leader.stdout is not None
            lines: list[bytes] = []
            while len(lines) < 2:
                chunk = await _read_line(leader.stdout)
                assert chunk, f"the leader's output ended early: {lines!r}"
                lines += chunk.splitlines()
            assert b"up" in lines
            child_pid = int(next(line for line in lines if line != b"up"))
            await leader.wait()
            assert os.getpgid(child_pid) == pgid
            assert await _belongs(pgid, "run-7")
            assert not await _belongs(pgid, "run-8")
        finally:
            # The orphan is not ours to wait for; kill the group so nothing is left.
            with suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            if leader.stdin is not None:
                await leader.stdin.aclose()
            if leader.stdout is not None:
                await leader.stdout.aclose()
            await leader.wait()


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
async def test_an_empty_environment_of_a_live_process_is_read_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A process caught in execve shows an empty environment: unknown, not "not ours".

    The agent here starts with an empty environment (what /proc shows mid-execve),
    and only execs into one carrying the run id once the check has seen it empty.
    """
    # The real retry loop, given room to wait for this test's exec on a loaded machine.
    monkeypatch.setattr(procinfo, "ENVIRON_TRIES", 2000)
    saw_empty = threading.Event()
    real_read = procinfo._proc_environ

    def spying_read(pid: int) -> set[str] | None:
        environ = real_read(pid)
        if environ == set():
            saw_empty.set()
        return environ

    monkeypatch.setattr(procinfo, "_proc_environ", spying_read)
    exec_code = (
        "import os, sys\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
        "os.execve(sys.executable, [sys.executable, '-c', "
        "'import sys; print(\"again\", flush=True); sys.stdin.read()'], "
        "{'PROHOST_RUN_ID': 'run-exec'})\n"
    )
    with trio.fail_after(60):
        process = await trio.lowlevel.open_process(
            [sys.executable, "-c", exec_code], start_new_session=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={},
        )
        try:
            assert process.stdin is not None and process.stdout is not None
            assert await _read_line(process.stdout) == b"ready\n"
            async with trio.open_nursery() as nursery:
                verdict: list[bool] = []

                async def check() -> None:
                    verdict.append(await _belongs(process.pid, "run-exec"))

                nursery.start_soon(check)
                await trio.to_thread.run_sync(saw_empty.wait)
                await process.stdin.send_all(b"go\n")
            assert verdict == [True]
            assert await _read_line(process.stdout) == b"again\n"
        finally:
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()


async def test_a_live_process_that_never_shows_the_run_id_is_not_ours(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second look is bounded: an environment that stays empty means "not ours"."""
    monkeypatch.setattr(procinfo, "ENVIRON_TRIES", 3)
    with trio.fail_after(30):
        async with session_leader({}) as process:
            assert not await _belongs(process.pid, "run-1")


@pytest.mark.skipif(shutil.which("ps") is None, reason="needs ps")
async def test_the_ps_fallback_reads_environment_and_members() -> None:
    """The macOS path (ps eww), exercised wherever ps understands it."""
    with trio.fail_after(30):
        async with session_leader(_env("run-ps")) as process:
            words = await trio.to_thread.run_sync(procinfo._ps_environ, process.pid)
            assert "PROHOST_RUN_ID=run-ps" in words
            assert "PROHOST_RUN_ID=run-p" not in words
            members = await trio.to_thread.run_sync(
                procinfo._group_members, process.pid, procinfo._ps_processes
            )
            assert members == [process.pid]
        assert await trio.to_thread.run_sync(procinfo._ps_environ, process.pid) == set()
