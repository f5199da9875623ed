"""Blocking calls (sqlite, fsync, /proc) with a bound that holds even when the call hangs.

``trio.to_thread.run_sync`` without ``abandon_on_cancel`` cannot be cancelled: a
``move_on_after`` around it only takes effect once the thread returns, so a hung
disk (an NFS home that stopped answering) would hold a run, and the second
signal's 5-second window, forever. :func:`run_bounded` runs the call with
``abandon_on_cancel=True`` under a shielded scope of its own: an ordinary cancel
(a run's cancel, the first signal) still lets a step that was begun finish, but
when the bound passes the thread is abandoned — trio stops waiting for it, the
thread itself runs on until the call returns or the process exits — and the
caller gets :class:`StepTimedOut`.

Abandoning is only safe for a call that (a) touches nothing trio owns, (b) leaves
shared state consistent whenever it eventually ends, and (c) whose result the
caller can do without. Each use says why it qualifies; for the ledger see
:mod:`prohost.ledger` (every method is one sqlite transaction under the ledger's
lock, so the abandoned call commits or rolls back on its own, later callers wait
for the lock only a bounded time, and whether the step is durable is simply
unknown — the next start reads the ledger and repairs it, §7).

:func:`hurry` is the second signal's hard deadline: from then on no bounded step,
already running or started later, outlasts it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TypeVar

import trio
from trio.lowlevel import RunVar

__all__ = ["StepTimedOut", "hurry", "run_bounded"]

log = logging.getLogger("prohost.blocking")

T = TypeVar("T")

# Per trio.run (not per process): tests run many harnesses in one interpreter.
_in_flight: RunVar[set[trio.CancelScope]] = RunVar("prohost_bounded_in_flight")
_hard_deadline: RunVar[float] = RunVar("prohost_bounded_hard_deadline", default=math.inf)


class StepTimedOut(TimeoutError):
    """A blocking step did not finish within its bound and was abandoned.

    A :class:`TimeoutError`, hence an :class:`OSError`: callers that already
    handle a failing disk handle a hung one the same way. Whether the step took
    effect is unknown.
    """


def _scopes() -> set[trio.CancelScope]:
    try:
        return _in_flight.get()
    except LookupError:
        scopes: set[trio.CancelScope] = set()
        _in_flight.set(scopes)
        return scopes


def hurry(deadline: float) -> None:
    """Let no bounded step outlast ``deadline`` (``trio.current_time()`` units, s).

    Shortens every step in flight and caps every later one in this trio run; a
    later, larger deadline never lengthens them again. For the second signal's
    window (§9): a hung step then gives up in time for the harness to exit.
    """
    deadline = min(deadline, _hard_deadline.get())
    _hard_deadline.set(deadline)
    for scope in _scopes():
        scope.deadline = min(scope.deadline, deadline)


async def run_bounded(fn: Callable[..., T], *args: object, limit_s: float, what: str) -> T:
    """``fn(*args)`` in a worker thread; its result, or :class:`StepTimedOut` after ``limit_s``.

    ``what`` names the step in the warning and the error (no secrets in it).
    Only use it for calls that are safe to abandon (see the module docstring).

    Cancelled: not interrupted — the step is shielded so that one that was begun
    is finished — but still bounded by ``limit_s`` and by :func:`hurry`; the
    cancel is delivered at the caller's next checkpoint.
    """
    started = trio.current_time()
    deadline = min(started + limit_s, _hard_deadline.get())
    scopes = _scopes()
    with trio.CancelScope(shield=True, deadline=deadline) as scope:
        scopes.add(scope)
        try:
            return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)
        finally:
            scopes.discard(scope)
    # Only the bound (or hurry) can cancel a shielded scope.
    log.warning("%s took over %.1f s and was abandoned; the disk may be failing or hung",
                what, trio.current_time() - started)
    raise StepTimedOut(
        f"{what} did not finish within its bound and was abandoned (a hung or failing "
        "disk?); whether it took effect is unknown, and the next start repairs it"
    )
