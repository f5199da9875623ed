"""The soak's subprocesses: each in its own session (so its whole group can be
killed), its output teed line by line into a log file in the output folder, and
the /proc scan that finds agent processes left behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import trio

#: Lines that mean the process hit an exception it did not handle.
TRACEBACK_MARKS = ("Traceback (most recent call last)", "AssertionError")


class Child:
    """One subprocess the soak started, and every line it printed (stdout+stderr)."""

    def __init__(self, name: str, proc: trio.Process, log_path: Path) -> None:
        self.name = name
        self.proc = proc
        self.log_path = log_path
        self.lines: list[str] = []
        #: Exit statuses the soak caused on purpose; None: any exit is a crash.
        self.expected: frozenset[int] | None = None
        self.exited = trio.Event()
        self._changed = trio.Event()
        self._closed = trio.Event()

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def pump(self) -> None:
        """Copy the child's output into its log file and ``lines`` until it closes.
        Cancelled: stops copying; the file holds everything read so far."""
        if self.proc.stdout is None:
            raise RuntimeError(f"{self.name}: started without an output pipe")
        pending = b""
        # A local log file: each write blocks for microseconds, which the soak can afford.
        with open(self.log_path, "ab") as log:  # noqa: ASYNC230
            try:
                while chunk := await self.proc.stdout.receive_some(65536):
                    log.write(chunk)
                    log.flush()
                    *complete, pending = (pending + chunk).split(b"\n")
                    self.lines.extend(line.decode("utf-8", "replace") for line in complete)
                    self._wake()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        if pending:
            self.lines.append(pending.decode("utf-8", "replace"))
        self._closed.set()
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_line(self, predicate: Callable[[str], bool]) -> str | None:
        """The first line for which ``predicate`` holds, once printed; None if the
        output closed without one. Cancelled: returns nothing."""
        seen = 0
        while True:
            for line in self.lines[seen:]:
                if predicate(line):
                    return line
            seen = len(self.lines)
            if self._closed.is_set():
                return None
            await self._changed.wait()

    async def wait_closed(self) -> None:
        """Return once the output is closed (the log is complete)."""
        await self._closed.wait()

    def tracebacks(self) -> list[str]:
        return [line for line in self.lines if any(mark in line for mark in TRACEBACK_MARKS)]

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the child itself (not its group: its agents have their own)."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signum)

    def kill_group(self) -> None:
        """SIGKILL the child's whole process group (cleanup)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)


async def start_child(
    name: str, argv: Sequence[str], log_path: Path, env: dict[str, str], cwd: Path | None = None
) -> Child:
    """Start ``argv`` in a new session, stdin closed, stdout and stderr on one pipe."""
    proc = await trio.lowlevel.open_process(
        list(argv), env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True,
    )
    return Child(name, proc, log_path)


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting to be reaped is not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def marked_processes(marker: str) -> list[tuple[int, str]]:
    """Live processes whose command line carries ``marker``, except harnesses (whose
    ``--exec`` carries it too): (pid, command line) of every stand-in agent left."""
    found = []
    needle = marker.encode()
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as file:
                cmdline = file.read()
        except OSError:
            continue
        if needle not in cmdline or b"\0agent\0run\0" in cmdline:
            continue
        if alive(int(entry)):
            found.append((int(entry), cmdline.replace(b"\0", b" ").decode("utf-8", "replace")))
    return found


def kill_marked(marker: str) -> None:
    """Cleanup: SIGKILL every process that carries ``marker``, and its group."""
    ours = os.getpgrp()
    for pid, _ in marked_processes(marker):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            group = os.getpgid(pid)
            if group != ours:
                os.killpg(group, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
