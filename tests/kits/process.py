"""Shared pieces for tests that run the harness as a real subprocess and kill it.

``python -m prohost agent run`` on a home paired with the in-process reference
server, its log captured, and helpers to wait for processes to be gone, read the
ledger and redeliver runs. Used by the tests in tests/process/, and by a few others
that start a harness process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from prohost.engine.ledger import Ledger, LedgerRow
from prohost.server import ServerHandle
from tests.kits.harness import Gate, acks, delivery_frame, pair_home, running_server, wait_for_ack
from tests.kits.paths import logs_folder


class HarnessProcess:
    """One ``python -m prohost agent run`` subprocess, and its log lines (its stderr)."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.log: list[str] = []
        self._changed = trio.Event()
        self._log_closed = trio.Event()

    async def read_log(self) -> None:
        assert self.proc.stderr is not None
        pending = b""
        while chunk := await self.proc.stderr.receive_some():
            *lines, pending = (pending + chunk).split(b"\n")
            self.log.extend(line.decode("utf-8", "replace") for line in lines)
            self._changed.set()
            self._changed = trio.Event()
        if pending:
            self.log.append(pending.decode("utf-8", "replace"))
        self._log_closed.set()

    async def wait_log_closed(self) -> None:
        """Return once the harness's stderr is closed (it exited): the log is complete."""
        await self._log_closed.wait()

    async def wait_first_line(self) -> str:
        """Return the first line the harness wrote, once it has written one."""
        while not self.log:
            await self._changed.wait()
        return self.log[0]

    def tracebacks(self) -> list[str]:
        """Lines of the log that show a traceback or a failed assert."""
        return [line for line in self.log
                if "Traceback" in line or "AssertionError" in line]

    async def wait_log(self, text: str) -> None:
        """Return once a log line containing ``text`` has been written."""
        while not any(text in line for line in self.log):
            await self._changed.wait()

    def send_signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    async def kill(self) -> None:
        """SIGKILL: the harness gets no chance to do anything (§7's ``kill -9``)."""
        self.proc.send_signal(signal.SIGKILL)
        assert await self.proc.wait() == -signal.SIGKILL

    async def wait_clean_exit(self) -> int:
        """The harness's exit status, once it has exited and its log is complete;
        the log must show no traceback."""
        code = await self.proc.wait()
        await self.wait_log_closed()
        assert self.tracebacks() == [], "the harness's log shows a traceback"
        return code


@asynccontextmanager
async def harness_process(
    server: ServerHandle,
    home: Path,
    command: str,
    *,
    concurrency: int = 1,
    connected: bool = True,
    extra_env: Mapping[str, str] | None = None,
    output: int | None = None,
    extra_args: Sequence[str] = (),
    program: Sequence[str] = (sys.executable, "-m", "prohost"),
) -> AsyncIterator[HarnessProcess]:
    """Start a harness on ``home`` (already paired), with ``extra_args`` after its
    flags, and wait until it is connected
    (with ``connected=False``, hand it over as soon as the process is started).
    With ``output`` (a file descriptor), its stdout and stderr go there and its log
    is not read.

    On the way out a harness still running is killed, and its log is printed (pytest
    shows it when the test fails).
    """
    env = {key: value for key, value in os.environ.items() if not key.startswith("PROHOST_")}
    env["PROHOST_HOME"] = str(home)
    env.update(extra_env or {})
    connects = server.state.total_connects
    proc = await trio.lowlevel.open_process(
        [*program, "agent", "run", "--exec", command,
         "--concurrency", str(concurrency), "--machine", "t",
         # Confined, as by default (§13): the fakes log into this folder only.
         "--allow-write", str(logs_folder(home.parent)), *extra_args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL if output is None else output,
        stderr=subprocess.PIPE if output is None else output,
    )
    harness = HarnessProcess(proc)
    try:
        async with trio.open_nursery() as nursery:
            if output is None:
                nursery.start_soon(harness.read_log)

            async def watch_exit() -> None:
                await proc.wait()
                server.state.changed()  # so that the wait below sees it

            nursery.start_soon(watch_exit)
            try:
                if connected:
                    await server.wait_until(
                        lambda s: proc.returncode is not None
                        or (s.total_connects > connects and s.connected > 0))
                    assert proc.returncode is None, f"the harness exited with {proc.returncode}"
                yield harness
            finally:
                with trio.CancelScope(shield=True):
                    if proc.returncode is None:
                        proc.kill()
                    await proc.wait()
                    nursery.cancel_scope.cancel()
    finally:
        print(f"--- log of harness pid {proc.pid} (exit {proc.returncode}) ---",
              *harness.log, sep="\n")


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, waiting to be reaped, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


async def wait_gone(pid: int, within_s: float = 10.0) -> bool:
    """Wait (on a pidfd, no polling) until ``pid`` has exited; False if it has not
    within ``within_s`` (generous: only a process nobody killed takes that long)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        with trio.move_on_after(within_s):
            await trio.lowlevel.wait_readable(fd)
    finally:
        os.close(fd)
    return not alive(pid)


def kill_leftovers(pids: Iterable[int]) -> None:
    """Test cleanup: SIGKILL every given agent process and its group."""
    ours = os.getpgrp()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            group = os.getpgid(pid)
            if group != ours:
                os.killpg(group, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


async def until(server: ServerHandle, gate: Gate, predicate: Callable[[], bool]) -> None:
    """Return once ``predicate()`` holds, re-checking whenever the server or the gate
    changes (for conditions that mix both, such as "reported, or started twice")."""
    async with trio.open_nursery() as nursery:

        async def on_server() -> None:
            await server.wait_until(lambda _: predicate())
            nursery.cancel_scope.cancel()

        async def on_gate() -> None:
            await gate.wait(lambda _: predicate())
            nursery.cancel_scope.cancel()

        nursery.start_soon(on_server)
        nursery.start_soon(on_gate)


async def kill_harness(server: ServerHandle, harness: HarnessProcess) -> None:
    """SIGKILL the harness, and return once the server has seen its connection go."""
    await harness.kill()
    await server.wait_until(lambda s: s.connected == 0)


def ledger_row(home: Path, run_id: str) -> LedgerRow:
    with Ledger.open(home / "ledger.sqlite3") as ledger:
        row = ledger.get(run_id)
    assert row is not None, f"run {run_id} is not in the ledger"
    return row


async def redeliver(
    server: ServerHandle, harness: HarnessProcess, run_id: str, delivery_id: str
) -> int:
    """Send the run's delivery again, as the server would, and return the ack's status."""
    secret = next(iter(server.state.harnesses.values())).secret
    await server.send_raw(delivery_frame(secret, server.run(run_id).body_text,
                                         delivery_id=delivery_id))
    await server.wait_until(lambda s: harness.proc.returncode is not None
                            or any(ack.id == delivery_id for ack in acks(s)))
    assert harness.proc.returncode is None, f"the harness exited with {harness.proc.returncode}"
    return (await wait_for_ack(server, delivery_id)).status


# ---------------------------------------------------------------------- the tests


@asynccontextmanager
async def paired_with_gate(
    home: Path, *, also_kill: Iterable[int] = (), **server_config: Any
) -> AsyncIterator[tuple[Gate, ServerHandle]]:
    """A Gate, a reference server, and ``home`` paired with it. On the way out every
    agent the Gate saw (and ``also_kill``, read then) is killed if still alive."""
    gate = Gate()
    async with trio.open_nursery() as nursery:
        await nursery.start(gate.serve)
        try:
            async with running_server(**server_config) as server:
                pair_home(server, home)
                yield gate, server
        finally:
            kill_leftovers([*gate.pids.values(), *also_kill])
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def gated_process(
    home: Path,
    *,
    connected: bool = True,
    extra_env: Mapping[str, str] | None = None,
    output: int | None = None,
    program: Sequence[str] = (sys.executable, "-m", "prohost"),
    **server_config: Any,
) -> AsyncIterator[tuple[Gate, ServerHandle, HarnessProcess]]:
    """:func:`paired_with_gate`, and one :func:`harness_process` on ``home`` whose
    agents are the Gate's. ``connected``, ``extra_env``, ``output`` and ``program``
    are :func:`harness_process`'s; the other keywords configure the server."""
    async with paired_with_gate(home, **server_config) as (gate, server), harness_process(
        server, home, gate.command, connected=connected, extra_env=extra_env, output=output,
        program=program,
    ) as harness:
        yield gate, server, harness
