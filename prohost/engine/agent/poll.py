"""Waiting on an agent's pipes and on its leader's exit, all at once, from one task.

:mod:`prohost.engine.agent.process` watches an agent from the single task that
calls ``AgentWatch.finish``: it asks a poller which of the agent's pipes (and whether its
leader) is ready, handles them, and asks again. trio waits on one file descriptor
per task, so on Linux the poller is an epoll instance of its own, holding the pipes
and a pidfd, which trio waits on as one descriptor: a run costs one task and one
scheduler trip per wake-up, not a task per pipe. Elsewhere (or without pidfd), each
wait is a nursery with a task per descriptor: the same answers, at a higher price.

Readiness is level-triggered in both: a descriptor not handled after a wait is
reported again by the next, so a wait abandoned on cancellation loses nothing.
"""

from __future__ import annotations

import os
import select
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from prohost.errors import leaves

#: The key the leader's exit is reported under (no file descriptor is negative).
EXIT = -1

#: Whether the epoll poller may be used (tests turn it off to run the other one).
USE_EPOLL = hasattr(select, "epoll") and hasattr(os, "pidfd_open")


class Poller(Protocol):
    def read(self, fd: int) -> None:
        """Report ``fd`` when it can be read (or is at end-of-file)."""

    def write(self, fd: int) -> None:
        """Report ``fd`` when it can be written (or its reader has gone)."""

    def forget(self, fd: int) -> None:
        """Stop reporting ``fd`` (or, given :data:`EXIT`, the leader's exit)."""

    async def wait(self) -> list[int]:
        """The descriptors ready now (and :data:`EXIT` once the leader has exited),
        once there is at least one; an empty list is possible and means: ask again.

        Cancelled: nothing is lost; the next wait reports the same.
        """
        ...

    def close(self) -> None:
        """Release what the poller holds; the descriptors it reported stay open."""


class Child(Protocol):
    """What a poller needs of the process it watches: a :class:`trio.Process`, or
    the harness's own record of a child spawned from a confined thread
    (:mod:`prohost.engine.agent.process`)."""

    @property
    def pid(self) -> int: ...

    async def wait(self) -> int: ...


def poller_for(proc: Child) -> Poller:
    """The cheapest poller that works here, watching ``proc``'s exit from the start."""
    if USE_EPOLL:
        try:
            return _Epoll(proc.pid)
        except OSError:
            pass  # no pidfd (Linux before 5.3, or a sandbox denying it)
    return _Tasks(proc)


class _Epoll:
    def __init__(self, pid: int) -> None:
        self._pidfd = os.pidfd_open(pid)
        try:
            self._epoll = select.epoll()
        except BaseException:
            os.close(self._pidfd)
            raise
        self._epoll.register(self._pidfd, select.EPOLLIN)

    def read(self, fd: int) -> None:
        self._epoll.register(fd, select.EPOLLIN)

    def write(self, fd: int) -> None:
        self._epoll.register(fd, select.EPOLLOUT)

    def forget(self, fd: int) -> None:
        self._epoll.unregister(self._pidfd if fd == EXIT else fd)

    async def wait(self) -> list[int]:
        await trio.lowlevel.wait_readable(self._epoll.fileno())
        return [EXIT if fd == self._pidfd else fd for fd, _ in self._epoll.poll(0)]

    def close(self) -> None:
        trio.lowlevel.notify_closing(self._epoll.fileno())
        self._epoll.close()
        os.close(self._pidfd)


class _Tasks:
    def __init__(self, proc: Child) -> None:
        self._proc = proc
        self._waits: dict[int, Callable[[int], Awaitable[object]]] = {EXIT: self._exited}

    def read(self, fd: int) -> None:
        self._waits[fd] = trio.lowlevel.wait_readable

    def write(self, fd: int) -> None:
        self._waits[fd] = trio.lowlevel.wait_writable

    def forget(self, fd: int) -> None:
        self._waits.pop(fd, None)

    async def wait(self) -> list[int]:
        ready: list[int] = []
        try:
            async with trio.open_nursery() as nursery:
                for fd, wait in self._waits.items():
                    nursery.start_soon(self._first, wait, fd, ready, nursery.cancel_scope)
        except BaseExceptionGroup as group:
            # The nursery is this wait's own business: its caller gets what the
            # Epoll poller would raise (a plain Cancelled, or the one real error).
            error = _the_one_error(group)
            if error is None:
                raise
            raise error from None
        return ready

    async def _exited(self, _: int) -> None:
        await self._proc.wait()

    @staticmethod
    async def _first(
        wait: Callable[[int], Awaitable[object]], fd: int, ready: list[int],
        scope: trio.CancelScope,
    ) -> None:
        await wait(fd)
        ready.append(fd)
        scope.cancel()  # the first ready one is enough: the caller handles it, and asks again

    def close(self) -> None:
        pass


def _the_one_error(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The exception a caller should see instead of the group, if there is one.

    Its ``Cancelled`` leaves are the nursery of :meth:`_Tasks.wait` cancelling its
    own tasks (or the caller's cancellation, which any next checkpoint raises
    again). So a group of nothing but ``Cancelled`` becomes one ``Cancelled``, and
    one real error among them becomes that error.
    """
    found = leaves(group)
    real = [leaf for leaf in found if not isinstance(leaf, trio.Cancelled)]
    if len(real) == 1:
        return real[0]
    if not real and found:
        return found[0]
    return None
