"""Where the harness's git that reads a run's places runs (docs/protocol.md §13:
nothing a run leaves behind is read outside a confinement).

:class:`ConfinedGit` runs each git inside one confinement of the run's kind
(bubblewrap: the run's hidden places hidden, no network, nothing writable), one
process for many commands: a small server (:mod:`prohost.engine.repos.gitserve`)
started inside it runs them one after another. So ``changes`` at a run's end, with
its ``status``, ``diff-tree``, ``rev-list`` and line counts, costs one confined
process, not one per git. There git may read everything a run wrote (its config
and ``config.worktree``, attributes, a submodule's repository) and run what it
names: only with the run's own rights.

:data:`PLAIN_GIT` is the same interface unconfined (:func:`~.gitcmd.git`, with
its command-line overrides): where runs are not confined by bubblewrap
(Landlock alone, ``--sandbox off``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import trio

from prohost.engine.repos.gitcmd import (
    GIT_TIMEOUT_S,
    HARDENED,
    GitError,
    GitTimedOut,
    answer,
    git,
    git_env,
    what_of,
)
from prohost.invocation import command

#: Makes a command line run confined: ``argv``, the folders it may read though
#: hidden, the folders it may write; the command line and a descriptor to pass it
#: (bubblewrap's filter on Unix sockets; ``None``: none), closed by the spawner
#: once it has spawned. Blocking. (As :data:`.lanerepo.Confine`.)
Confine = Callable[[list[str], Sequence[Path], Sequence[Path]], tuple[list[str], int | None]]

#: The server run inside the confinement, by path (it imports only the stdlib).
SERVER = str(Path(__file__).with_name("gitserve.py"))
#: How long closing a session may wait for its process to end, in seconds.
_CLOSE_S = 2.0
#: How often :meth:`ConfinedGit._stop` looks whether its group is gone, in seconds.
_GONE_POLL_S = 0.005


class Git(Protocol):
    """Runs ``git *args`` as :func:`~.gitcmd.git` does (its stdout, or
    :class:`~.gitcmd.GitError`)."""

    @property
    def confined(self) -> bool:
        """Whether each git runs inside a run's confinement."""

    @property
    def scratch(self) -> Path | None:
        """A folder of the harness's that the git can read (``None``: any)."""

    async def __call__(self, *args: str, timeout_s: float = GIT_TIMEOUT_S,
                       env: Mapping[str, str] | None = None,
                       ok_codes: tuple[int, ...] = (0,)) -> str:
        """Cancelled: the git (and its confinement) is killed."""


class _PlainGit:
    """:func:`~.gitcmd.git`, unconfined (its command-line overrides only)."""

    confined = False
    scratch = None

    async def __call__(self, *args: str, timeout_s: float = GIT_TIMEOUT_S,
                       env: Mapping[str, str] | None = None,
                       ok_codes: tuple[int, ...] = (0,)) -> str:
        """Cancelled: as :func:`~.gitcmd.git`."""
        return await git(*args, timeout_s=timeout_s, env=env, ok_codes=ok_codes)


PLAIN_GIT: Git = _PlainGit()


class ConfinedGit:
    """Git commands run one after another in one confined process (started at the
    first, again after one was stopped). Use it as an async context manager: its
    process ends with the block."""

    confined = True

    def __init__(self, confine: Confine, readable: Sequence[Path],
                 scratch_root: Path) -> None:
        """``confine``: the run's confinement for a command; ``readable``: the
        run's places the git reads (worktrees, their repositories, the person's);
        a private folder under ``scratch_root`` is readable too (:attr:`scratch`)."""
        self._confine = confine
        self._readable = list(dict.fromkeys(readable))
        self._root = scratch_root
        self._scratch: Path | None = None
        self._process: trio.Process | None = None
        self._buffer = bytearray()
        self._lock = trio.Lock()
        #: Confined processes started (one, unless a git was stopped).
        self.started = 0

    @property
    def scratch(self) -> Path | None:
        """The session's own folder, readable inside (made at the first git)."""
        return self._scratch

    async def __aenter__(self) -> ConfinedGit:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def __call__(self, *args: str, timeout_s: float = GIT_TIMEOUT_S,
                       env: Mapping[str, str] | None = None,
                       ok_codes: tuple[int, ...] = (0,)) -> str:
        """Run ``git *args`` (with :data:`~.gitcmd.HARDENED`) inside the
        confinement, within ``timeout_s``.

        Cancelled (or timed out): the confinement is killed whole (its PID
        namespace ends with it), reaped, and the next git starts a new one."""
        request = _request(["git", *HARDENED, *args],
                           env if env is not None else git_env())
        what = what_of(args)
        async with self._lock:
            with trio.move_on_after(timeout_s) as scope:
                try:
                    process = await self._started()
                    assert process.stdin is not None
                    await process.stdin.send_all(request)
                    head = await self._line()
                    status, out_len, err_len = (int(word) for word in head.split())
                    out = await self._exactly(out_len)
                    err = await self._exactly(err_len)
                except BaseException:
                    await self._stop()
                    raise
            if scope.cancelled_caught:
                await self._stop()
                raise GitTimedOut(f"git {what} took longer than {timeout_s:g} s and was "
                                  "stopped")
        return answer(what, status, out, err, ok_codes)

    async def _started(self) -> trio.Process:
        if self._process is not None:
            return self._process
        # Abandoned when cancelled (a hung disk): what they make is the scratch
        # folders' sweep's at the next start.
        if self._scratch is None:
            self._scratch = await trio.to_thread.run_sync(_scratch, self._root,
                                                          abandon_on_cancel=True)
        argv, fd = await trio.to_thread.run_sync(
            self._confine, [sys.executable, "-I", "-S", SERVER],
            [*self._readable, self._scratch], [], abandon_on_cancel=True)
        try:
            # The filter (what a run planted, a filter or a hook, makes no Unix
            # socket in there) is read by bubblewrap as it starts: ours then closes.
            self._process = await trio.lowlevel.open_process(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, env=git_env(), start_new_session=True,
                pass_fds=() if fd is None else (fd,))
        except OSError as exc:
            raise GitError(f"could not run git confined: {exc.strerror or exc}") from None
        finally:
            if fd is not None:
                os.close(fd)
        self.started += 1
        self._buffer.clear()
        return self._process

    async def _more(self) -> None:
        process = self._process
        assert process is not None and process.stdout is not None
        data = await process.stdout.receive_some(1 << 16)
        if not data:
            raise GitError("the confined git ended early (is the confinement broken? "
                           f"see `{command('agent', 'status')}`)")
        self._buffer += data

    async def _line(self) -> str:
        while b"\n" not in self._buffer:
            await self._more()
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer[:] = rest
        return line.decode("ascii")

    async def _exactly(self, count: int) -> bytes:
        while len(self._buffer) < count:
            await self._more()
        data = bytes(self._buffer[:count])
        del self._buffer[:count]
        return data

    async def _stop(self) -> None:
        """Kill the confinement now, reap it, and wait until every process of its
        group is gone (shielded, bounded): bubblewrap's init inside is not the
        harness's child, so reaping the leader alone does not say its git (and
        what that git started) has ended."""
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with trio.CancelScope(shield=True, deadline=trio.current_time() + _CLOSE_S):
            await process.wait()
            # Polled: nothing tells the harness when processes it did not start end.
            while True:
                if not await trio.to_thread.run_sync(_group_runs, process.pid):
                    break
                await trio.sleep(_GONE_POLL_S)

    async def aclose(self) -> None:
        """End the confined process (its stdin closed, then killed if it lingers)
        and remove the scratch folder. Cancelled: shielded and bounded all the same."""
        process = self._process
        with trio.CancelScope(shield=True, deadline=trio.current_time() + _CLOSE_S):
            if process is not None and process.stdin is not None:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await process.stdin.aclose()
                with trio.move_on_after(_CLOSE_S / 2):
                    await process.wait()
        await self._stop()
        scratch, self._scratch = self._scratch, None
        if scratch is not None:
            with trio.CancelScope(shield=True, deadline=trio.current_time() + _CLOSE_S):
                await trio.to_thread.run_sync(shutil.rmtree, scratch, True,
                                              abandon_on_cancel=True)


def _group_runs(pgid: int) -> bool:
    """Blocking: whether a process of the group ``pgid`` still runs (a zombie does
    not: where the machine's init reaps none, bubblewrap's stays one). Linux's
    ``/proc``; ``False`` where there is none (bubblewrap is Linux's alone)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return False
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as file:
                fields = file.read().rpartition(b")")[2].split()
        except OSError:
            continue
        if len(fields) > 2 and fields[2] == b"%d" % pgid and fields[0] != b"Z":
            return True
    return False


def _request(argv: Sequence[str], env: Mapping[str, str]) -> bytes:
    """A request as :mod:`~prohost.engine.repos.gitserve` reads it: the counts,
    then each argument and variable ended by a NUL (as bytes: a path that is not
    UTF-8 goes as it is). Raises :class:`GitError` for a NUL in one (none can be
    passed to a program)."""
    words = [os.fsencode(arg) for arg in argv]
    words += [os.fsencode(name) + b"=" + os.fsencode(value) for name, value in env.items()]
    if any(b"\0" in word for word in words):
        raise GitError("a git argument or variable holds a NUL byte")
    return b"%d %d\n" % (len(argv), len(env)) + b"".join(word + b"\0" for word in words)


def _scratch(root: Path) -> Path:
    """Blocking: a new private folder under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="git-", dir=root))
