"""Spawning an agent confined (docs/protocol.md §13): from a thread in the
confinement's Landlock domain, and under bubblewrap, through the keeper.

:func:`spawn_confined` is :func:`prohost.engine.agent.process.run_agent`'s spawn
when the run is confined by bubblewrap or by Landlock alone; :class:`Spawned` is
what the watch reads of the process it made.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

import trio

from prohost.engine.blocking import wake_from_thread
from prohost.engine.sandbox import Confinement

__all__ = ["KEEPER", "Spawned", "spawn_confined"]

#: The first process in a run's bubblewrap (its PID namespace's second, after
#: bubblewrap's own init), between bubblewrap and the agent. The namespace ends
#: when it does, and the kernel then SIGKILLs all that is left in it at once; so
#: it outlives the agent. It starts the agent on its own stdin (kept aside first
#: on ``%(save)d``: a non-interactive shell gives a background job ``/dev/null``
#: before any redirection of its own), and only then ignores the stop's
#: signals (so the agent keeps their default dispositions); it waits for the
#: agent, says its exit status on the status pipe (``%(fd)d`` is that pipe in
#: every process of the run; dash cannot close a descriptor above 9, so the agent
#: has it too: a false status only ends its own run sooner), SIGTERMs all that is
#: left in the namespace and waits, looking at ``/proc`` (an empty namespace costs
#: no wait), until nothing but itself and init is left. The harness bounds that
#: wait by the grace: it SIGKILLs the group (bubblewrap, init, the keeper), and the
#: namespace with them, after it; a double fork and ``setsid`` cannot leave it.
KEEPER = """exec %(save)d<&0
"$@" <&%(save)d %(save)d<&- &
agent=$!
exec %(save)d<&-
trap '' TERM INT HUP
wait "$agent"
echo "$?" >/proc/self/fd/%(fd)d
kill -TERM -1 2>/dev/null
while :; do
  for p in /proc/[0-9]*; do
    case $p in /proc/1|/proc/$$) ;; *) sleep 0.05; continue 2;; esac
  done
  exit 0
done
"""


class Spawned:
    """A child spawned from a confined thread: what :class:`_Watch` reads of a
    :class:`trio.Process` (its pid, pipes and exit status), over the ``Popen``.

    Under bubblewrap's keeper (``status`` is its pipe) the process is bubblewrap,
    and the agent's end and exit status come on the pipe: :meth:`heard` reads it.
    """

    def __init__(self, popen: subprocess.Popen[bytes], stdin: trio.lowlevel.FdStream,
                 stdout: trio.lowlevel.FdStream, stderr: trio.lowlevel.FdStream,
                 status: int | None = None) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self.status = status
        #: The agent's exit status as the keeper said it (shell style: 128+N for
        #: signal N), once it has.
        self._said: int | None = None
        #: The keeper said it, or can no longer (its pipe ended, or bubblewrap did).
        self.agent_ended = False

    def heard(self) -> bool:
        """Read the keeper's status pipe; whether the agent has ended now. Never blocks."""
        if self.status is None or self.agent_ended:
            return self.agent_ended
        try:
            said = os.read(self.status, 64)
        except BlockingIOError:
            return False
        self.agent_ended = True
        with contextlib.suppress(ValueError):
            self._said = int(said.split(b"\n", 1)[0])
        return True

    @property
    def returncode(self) -> int | None:
        """Its exit status once it has exited (and it is reaped then), else ``None``;
        under the keeper, the agent's, once the keeper said it (a status above 128
        is taken as the signal it names, as the shell reports one), else
        bubblewrap's once it has exited without a word."""
        outer = self._popen.poll()
        if self.status is None:
            return outer
        if self._said is not None:
            return -(self._said - 128) if 128 < self._said <= 128 + 64 else self._said
        return outer if self.agent_ended or outer is not None else None

    async def wait(self) -> int:
        """Return its exit status once it has exited (for the poller without
        pidfds). Cancelled: the waiting thread is abandoned; it ends with the child."""
        return await trio.to_thread.run_sync(self._popen.wait, abandon_on_cancel=True)

    def close(self) -> None:
        if self.status is not None:
            os.close(self.status)
            self.status = None


async def spawn_confined(confinement: Confinement, command: str, *, cwd: Path,
                          env: Mapping[str, str]) -> Spawned:
    """Spawn ``command`` as ``run_agent`` does, confined: from a fresh thread that
    entered the confinement's Landlock domain first (:meth:`Confinement.spawn`),
    and under bubblewrap's keeper (:data:`KEEPER`) when the confinement is
    bubblewrap's. Raises ``OSError`` as a spawn does, and ``SubprocessError`` when
    the confinement cannot be entered (nothing is spawned then).

    Cancelled: not before the child exists (the spawn cannot be abandoned, as with
    :func:`trio.lowlevel.open_process`); then as the caller's.
    """
    stdin_child, stdin_ours = os.pipe()
    stdout_ours, stdout_child = os.pipe()
    stderr_ours, stderr_child = os.pipe()
    ours = [stdin_ours, stdout_ours, stderr_ours]
    theirs = [stdin_child, stdout_child, stderr_child]
    status: int | None = None
    argv = ["/bin/sh", "-c", command]
    if confinement.keeper:
        status, told = os.pipe()
        os.set_blocking(status, False)
        ours.append(status)
        theirs.append(told)
        argv = [*confinement.argv_prefix, "--chdir", str(cwd), "--", "/bin/sh", "-c",
                KEEPER % {"fd": told, "save": 6 if told == 5 else 5}, "prohost-keeper", *argv]
    try:
        child_env = dict(env)
        tried: list[bool] = []

        def spawn() -> subprocess.Popen[bytes]:
            tried.append(True)
            return subprocess.Popen(argv, stdin=stdin_child, stdout=stdout_child,
                                    stderr=stderr_child, cwd=cwd, env=child_env,
                                    start_new_session=True,
                                    pass_fds=(*theirs[3:], *confinement.pass_fds))

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
    stdin, stdout, stderr = (trio.lowlevel.FdStream(fd) for fd in ours[:3])
    return Spawned(popen, stdin, stdout, stderr, status=status)


async def _spawned(confinement: Confinement,
                   spawn: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """``spawn()`` made from a fresh thread in the confinement's domain
    (:meth:`Confinement.spawn_soon`): no worker thread waits for it. Raises what
    the spawn raises, or ``OSError`` without spawning when the thread could not
    enter the domain. Without a domain to enter (bubblewrap with its socket
    filter) it is made in one of trio's worker threads, as an unconfined spawn is:
    no thread is started for it.

    Cancelled: not before the child exists (the wait is shielded, as trio's own
    spawn is); it is then the caller's to stop.
    """
    if not confinement.has_domain:
        with trio.CancelScope(shield=True):
            # (Confinement.spawn calls it here, after rewinding what it passes.)
            return await trio.to_thread.run_sync(confinement.spawn, spawn)
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
