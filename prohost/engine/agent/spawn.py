"""Spawning an agent confined (docs/protocol.md §13): its command line under
bubblewrap, and, where the confinement has a Landlock domain, from a thread in it.

:func:`command_line` is the command ``start_agent`` spawns; :func:`spawn_confined`
its spawn when the confinement has a domain to enter first; :class:`Spawned` is
what the watch reads of the process that spawn made; :class:`Report` is what
bubblewrap says of a run's PID namespace, and :func:`namespace_leftovers` finds
what a run left there.

Under bubblewrap the process spawned is bubblewrap itself, and the agent's shell
is the second process of the run's PID namespace, after bubblewrap's init. That
init holds the agent's stdin, stdout and stderr, reaps every orphan of the
namespace, and ends only once nothing else is left in it; bubblewrap ends as soon
as the agent does, with the agent's exit status (shell style: 128+N for signal N).
So the watch reads the agent's end from bubblewrap's, and the namespace's from the
pipes: their end-of-file means the init is gone, and with it every process of
the run (a double fork and ``setsid`` leave the group, never the namespace).
bubblewrap's end is often seen just before its init's: then the init's children
(``/proc``, one file) say whether it is ending too or waits for what the run left.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

import trio

from prohost.engine.blocking import wake_from_thread
from prohost.engine.sandbox import Confinement

__all__ = ["Report", "Spawned", "command_line", "exit_status", "namespace_leftovers",
           "spawn_confined"]


def command_line(confinement: Confinement | None, command: str, cwd: Path,
                 report: Report | None = None) -> list[str]:
    """What ``start_agent`` spawns for ``command``: ``/bin/sh -c command``, after the
    confinement's prefix (bubblewrap's, with the working folder inside its view and
    ``report``'s pipe for its status)."""
    argv = ["/bin/sh", "-c", command]
    if confinement is None:
        return argv
    if confinement.namespaced:
        told = ["--json-status-fd", str(report.told)] if report is not None else []
        return [*confinement.argv_prefix, *told, "--chdir", str(cwd), "--", *argv]
    return [*confinement.argv_prefix, *argv]


class Report:
    """bubblewrap's status pipe (``--json-status-fd``): the first line it writes,
    once its init exists, names the init and the PID namespace. Never watched: read
    only when the run's end needs it. Close it after the run."""

    def __init__(self) -> None:
        self.fd, self.told = os.pipe()
        os.set_blocking(self.fd, False)
        self._said = b""
        self._init: tuple[int, int] | None = None

    def spawned(self) -> None:
        """bubblewrap has its end (or was not spawned): ours is closed."""
        if self.told >= 0:
            os.close(self.told)
            self.told = -1

    def init(self) -> tuple[int, int] | None:
        """The init's pid and the PID namespace's inode, once bubblewrap has said
        them; ``None`` before (or never: it failed to start). Never blocks."""
        if self._init is None and self.fd >= 0:
            with contextlib.suppress(BlockingIOError):
                self._said += os.read(self.fd, 4096)
            line, ended, _ = self._said.partition(b"\n")
            if ended:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    said = json.loads(line)
                    self._init = int(said["child-pid"]), int(said["pid-namespace"])
        return self._init

    def init_is_ending(self) -> bool:
        """The init is gone or has no child left, so it is ending (it ends once
        nothing else is left in the namespace): nothing of the run is left but it.
        ``False`` also when that cannot be told. Never blocks (one ``/proc`` file)."""
        init = self.init()
        if init is None:
            return False
        pid, namespace = init
        try:
            if os.stat(f"/proc/{pid}/ns/pid").st_ino != namespace:
                return True  # gone, its number since taken by another process
            with open(f"/proc/{pid}/task/{pid}/children", "rb") as children:
                return not children.read().strip()
        except FileNotFoundError:
            return True  # gone (and reaped)
        except OSError:
            return False

    def close(self) -> None:
        self.spawned()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def exit_status(code: int | None, *, namespaced: bool) -> int | None:
    """The agent's exit status as ``Popen.returncode`` says one (``-N``: signal N)
    from its process's: under bubblewrap, bubblewrap's, which passes the agent's on
    shell style (128+N for signal N; bubblewrap's own death by a signal is
    ``-N`` already)."""
    if namespaced and code is not None and 128 < code <= 128 + 64:
        return -(code - 128)
    return code


def namespace_leftovers(init: tuple[int, int]) -> list[int]:
    """The processes of the PID namespace of ``init`` (:meth:`Report.init`) but the
    init: what a run left there, also outside its group (``setsid``). Blocking
    (reads ``/proc``): call it from a thread."""
    pid, namespace = init
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == pid:
            continue
        with contextlib.suppress(OSError):
            if os.stat(f"/proc/{entry}/ns/pid").st_ino == namespace:
                found.append(int(entry))
    return found


class Spawned:
    """A child spawned from a confined thread: what :class:`_Watch` reads of a
    :class:`trio.Process` (its pid, pipes and exit status), over the ``Popen``."""

    def __init__(self, popen: subprocess.Popen[bytes], stdin: trio.lowlevel.FdStream,
                 stdout: trio.lowlevel.FdStream, stderr: trio.lowlevel.FdStream) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr

    @property
    def returncode(self) -> int | None:
        """Its exit status once it has exited (and it is reaped then), else ``None``."""
        return self._popen.poll()

    async def wait(self) -> int:
        """Return its exit status once it has exited (for the poller without
        pidfds). Cancelled: the waiting thread is abandoned; it ends with the child."""
        return await trio.to_thread.run_sync(self._popen.wait, abandon_on_cancel=True)


async def spawn_confined(confinement: Confinement, command: str, *, cwd: Path,
                          env: Mapping[str, str], report: Report | None = None) -> Spawned:
    """Spawn ``command`` as ``start_agent`` does (:func:`command_line`), from a fresh
    thread that entered the confinement's Landlock domain first
    (:meth:`Confinement.spawn_soon`). Raises ``OSError`` as a spawn does, and
    ``SubprocessError`` when the confinement cannot be entered (nothing is spawned
    then).

    Cancelled: not before the child exists (the spawn cannot be abandoned, as with
    :func:`trio.lowlevel.open_process`); then as the caller's.
    """
    stdin_child, stdin_ours = os.pipe()
    stdout_ours, stdout_child = os.pipe()
    stderr_ours, stderr_child = os.pipe()
    ours = [stdin_ours, stdout_ours, stderr_ours]
    theirs = [stdin_child, stdout_child, stderr_child]
    argv = command_line(confinement, command, cwd, report)
    told = (report.told,) if report is not None else ()
    try:
        child_env = dict(env)
        tried: list[bool] = []

        def spawn() -> subprocess.Popen[bytes]:
            tried.append(True)
            return subprocess.Popen(argv, stdin=stdin_child, stdout=stdout_child,
                                    stderr=stderr_child, cwd=cwd, env=child_env,
                                    start_new_session=True,
                                    pass_fds=(*confinement.pass_fds, *told))

        try:
            popen = await _spawned(confinement, spawn)
        except OSError as exc:
            if tried:
                raise  # the spawn's own failure (a missing cwd, …)
            # The thread could not enter the confinement, so nothing was spawned: the
            # same failure as a preexec's, never one of the working directory.
            raise subprocess.SubprocessError(f"entering the confinement failed: {exc}") from exc
    except BaseException:
        for fd in ours:
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    stdin, stdout, stderr = (trio.lowlevel.FdStream(fd) for fd in ours)
    return Spawned(popen, stdin, stdout, stderr)


async def _spawned(confinement: Confinement,
                   spawn: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """``spawn()`` made from a fresh thread in the confinement's domain
    (:meth:`Confinement.spawn_soon`): no worker thread waits for it. Raises what
    the spawn raises, or ``OSError`` without spawning when the thread could not
    enter the domain.

    Cancelled: not before the child exists (the wait is shielded, as trio's own
    spawn is); it is then the caller's to stop.
    """
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    delivered: list[tuple[subprocess.Popen[bytes] | None, BaseException | None]] = []

    def deliver(popen: subprocess.Popen[bytes] | None, error: BaseException | None) -> None:
        delivered.append((popen, error))
        wake_from_thread(token, done.set)

    confinement.spawn_soon(spawn, deliver)
    with trio.CancelScope(shield=True):
        await done.wait()
    popen, error = delivered[0]
    if error is not None:
        raise error
    assert popen is not None
    return popen
