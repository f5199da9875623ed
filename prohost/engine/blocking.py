"""Blocking calls (sqlite, fsync, /proc) with a bound that holds even when the call hangs.

``trio.to_thread.run_sync`` without ``abandon_on_cancel`` cannot be cancelled: a
``move_on_after`` around it only takes effect once the thread returns, so a hung
disk (an NFS home that stopped answering) would hold a run, and the second
signal's 5-second window, forever. :meth:`Bounds.run` runs the call with
``abandon_on_cancel=True`` under a shielded scope of its own: an ordinary cancel
(a run's cancel, the first signal) still lets a step that was begun finish, but
when the bound passes the thread is abandoned — trio stops waiting for it, the
thread itself runs on until the call returns or the process exits — and the
caller gets :class:`StepTimedOut`.

Abandoning is only safe for a call that (a) touches nothing trio owns, (b) leaves
shared state consistent whenever it eventually ends, and (c) whose result the
caller can do without. Each use says why it qualifies; for the ledger see
:mod:`prohost.engine.ledger` (every write is queued for the ledger's group commit, whose
writer applies it as a whole transaction or savepoint whether or not its caller
still waits; an abandoned caller's thread gives up after a bounded time, later
callers wait for the write connection only a bounded time, and whether the step
is durable is simply unknown — the next start reads the ledger and repairs it, §7).
The ledger's writer is either such a worker thread (the first caller that finds no
writer at work) or, while a harness runs, its one long-lived writer thread: a ledger
step then waits for the event that thread sets (:meth:`Bounds.wait`), under the same
bound and shield (:mod:`prohost.engine.ledger.served`).

:meth:`Bounds.hurry` is the second signal's hard deadline: from then on no bounded
step of that harness, already running or started later, outlasts it. One
:class:`Bounds` per harness holds every blocking file step of its runs and of its
supervisor (ledger, status.json, the working folder, MCP scratch folders,
worktrees), so that the second signal hurries them all (§9).

An abandoned thread still holds its :class:`trio.CapacityLimiter` token until the
call returns. A step repeated on a timer (status.json) passes a limiter of its
own with one token, so a hung disk costs it one thread, not a new one per
attempt, and never starves the default limiter the ledger's steps use.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator
from typing import TypeVar

import trio

__all__ = ["FILE_STEP_TIMEOUT_S", "Bounds", "StepTimedOut", "run_bounded", "wake_from_thread"]

log = logging.getLogger("prohost.blocking")

T = TypeVar("T")

#: Bound on one file step outside the ledger (a mkdir, an rmtree, status.json; s).
#: Each is a few local syscalls: longer means the disk is in trouble.
FILE_STEP_TIMEOUT_S = 30.0

def wake_from_thread(token: trio.lowlevel.TrioToken, wake: Callable[..., object],
                     *args: object) -> None:
    """From a thread that is not trio's: ``wake(*args)`` soon in trio's thread, or
    nothing when that trio run is over. A thread trio stopped waiting for (a run
    that ended first, a test whose trio run returned) can finish after it; then
    nobody waits for the wake, and raising there would only print a traceback
    from a thread nobody reads."""
    try:
        token.run_sync_soon(wake, *args)
    except trio.RunFinishedError:
        return  # (not contextlib.suppress: this is every ledger step's path, and cheaper)


class StepTimedOut(TimeoutError):
    """A blocking step did not finish within its bound and was abandoned.

    A :class:`TimeoutError`, hence an :class:`OSError`: callers that already
    handle a failing disk handle a hung one the same way. Whether the step took
    effect is unknown.
    """


class Bounds:
    """The bounded steps of one harness, so that its second signal can cut them short.

    Not shared between harnesses (tests run several in one trio run).
    """

    def __init__(self) -> None:
        self._in_flight: set[trio.CancelScope] = set()
        self._hard_deadline = math.inf

    def hurry(self, deadline: float) -> None:
        """Let no step outlast ``deadline`` (``trio.current_time()`` units, s).

        Shortens every step in flight and caps every later one; a later, larger
        deadline never lengthens them again. For the second signal's window (§9):
        a hung step then gives up in time for the harness to exit.
        """
        self._hard_deadline = min(deadline, self._hard_deadline)
        for scope in self._in_flight:
            scope.deadline = min(scope.deadline, self._hard_deadline)

    async def run(self, fn: Callable[..., T], *args: object, limit_s: float, what: str) -> T:
        """``fn(*args)`` in a worker thread; its result, or :class:`StepTimedOut` after
        ``limit_s`` s or at the :meth:`hurry` deadline, whichever comes first.

        ``what`` names the step in the warning and the error (no secrets in it).
        Only use it for calls that are safe to abandon (see the module docstring).

        Cancelled: not interrupted — the step is shielded so that one that was
        begun is finished — but still bounded; the cancel is delivered at the
        caller's next checkpoint.
        """
        return await self._run(fn, args, limit_s, what, None)

    async def wait(self, done: trio.Event, *, limit_s: float, what: str) -> None:
        """Wait for ``done``, set once a step another thread carries out is over
        (the ledger's writer thread, :mod:`prohost.engine.ledger.served`), bounded
        and shielded exactly as :meth:`run`: :class:`StepTimedOut` at the bound, the
        step itself going on in its thread (the same rules for what may be
        abandoned apply). Its result is the caller's to read.

        Cancelled: as :meth:`run`.
        """
        with self._bound(limit_s, what):
            await done.wait()

    async def file_step(self, fn: Callable[..., T], *args: object, what: str,
                        limit_s: float = FILE_STEP_TIMEOUT_S,
                        limiter: trio.CapacityLimiter | None = None) -> T:
        """A file step outside the ledger (a folder, status.json), as :meth:`run`
        does it; kept apart from the ledger's steps, which :meth:`run` takes.
        ``limiter``: the threads' limiter (trio's default one if ``None``); waiting
        for its token counts against the bound too.

        Cancelled: as :meth:`run`.
        """
        return await self._run(fn, args, limit_s, what, limiter)

    def deadline(self, limit_s: float) -> float:
        """When a step begun now must end: in ``limit_s`` s, or at the :meth:`hurry`
        deadline if that comes first (``trio.current_time()`` units)."""
        return min(trio.current_time() + limit_s, self._hard_deadline)

    async def _run(self, fn: Callable[..., T], args: tuple[object, ...], limit_s: float,
                   what: str, limiter: trio.CapacityLimiter | None) -> T:
        with self._bound(limit_s, what):
            result = await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True,
                                                   limiter=limiter)
        return result

    @contextlib.contextmanager
    def _bound(self, limit_s: float, what: str) -> Iterator[None]:
        """The body shielded, and cancelled at the bound (or the :meth:`hurry`
        deadline), which then raises :class:`StepTimedOut` out of it."""
        started = trio.current_time()
        with trio.CancelScope(shield=True, deadline=self.deadline(limit_s)) as scope:
            self._in_flight.add(scope)
            try:
                yield
            finally:
                self._in_flight.discard(scope)
        if not scope.cancelled_caught:
            return
        # Only the bound (or hurry) can cancel a shielded scope.
        log.warning("%s took over %.1f s and was abandoned; the disk may be failing or hung",
                    what, trio.current_time() - started)
        raise StepTimedOut(
            f"{what} did not finish within its bound and was abandoned (a hung or failing "
            "disk?); whether it took effect is unknown, and the next start repairs it"
        )


async def run_bounded(fn: Callable[..., T], *args: object, limit_s: float, what: str) -> T:
    """:meth:`Bounds.run` for a step no second signal needs to hurry.

    Cancelled: as :meth:`Bounds.run`.
    """
    return await Bounds().run(fn, *args, limit_s=limit_s, what=what)
