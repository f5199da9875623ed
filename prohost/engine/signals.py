"""SIGINT and SIGTERM for the whole life of ``prohost agent run`` (§9).

trio's signal receiver only exists while the supervisor runs. Before it (imports,
the lock, the ledger, the panel starting) and after it (closing the ledger, the
interpreter's exit), Python's default would kill the process with status −15 or
raise ``KeyboardInterrupt`` in the middle of whatever it was doing. So the
handlers here are installed first thing and only *remember* each signal; the
supervisor obeys the remembered ones once it is up (a first drains, a second
stops), and :func:`final_status` blocks both signals at the very end, so that a
signal in the last instants still counts (a second one means exit 130) and can
never kill the process by its default action.

This module must stay cheap to import: ``python -m prohost`` loads it before
anything else.
"""

from __future__ import annotations

import os
import signal
from types import FrameType

#: The signals §9 gives a meaning to.
WATCHED = (signal.SIGINT, signal.SIGTERM)
#: The exit status of a stop (second signal) or of a third signal (§9).
STOPPED_STATUS = 130
#: "Read your requests" (``prohost agent cancel``): never fatal, from the first
#: moment on, so a request signalled while the harness starts cannot kill it (its
#: default action would); the harness reads every pending request once it is up
#: anyway (:mod:`prohost.engine.supervisor.requests`).
REQUEST_SIGNAL = signal.SIGUSR1

_received: list[int] = []
_handed_over = 0
_installed = False


def install() -> None:
    """Remember SIGINT/SIGTERM from now on instead of dying of them (idempotent)."""
    global _installed
    if _installed:
        return
    for signum in WATCHED:
        signal.signal(signum, _remember)
    signal.signal(REQUEST_SIGNAL, _nothing)
    _installed = True


def _nothing(signum: int, frame: FrameType | None) -> None:
    """A request's signal before (or after) the harness listens for it: nothing to
    do, its request file waits for the harness's look at start."""


def _remember(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)
    if len(_received) >= 3:
        # Third signal (§9): at once. Outside the supervisor no agent group is
        # alive (the supervisor kills every one before it returns).
        os._exit(STOPPED_STATUS)


def take_pending() -> list[tuple[int, int]]:
    """The signals remembered since the last call, for the supervisor to obey:
    ``(how many came up to and including this one, signal number)`` each.

    Call it only once trio's receiver is installed: from then on nothing lands here.
    """
    global _handed_over
    pending = [(index + 1, _received[index]) for index in range(_handed_over, len(_received))]
    _handed_over = len(_received)
    return pending


def note(signum: int) -> int:
    """Count a signal the supervisor received itself; return how many came so far."""
    global _handed_over
    _received.append(signum)
    _handed_over = len(_received)
    return len(_received)


def final_status(code: int) -> int:
    """Block, then ignore, SIGINT/SIGTERM for good and return the exit status to use.

    A signal arriving from here on is ignored, in every thread: it can never kill
    the process by its default action (status −15). One that arrived after
    the supervisor finished still counts: a second signal turns a clean drain's 0
    into 130 (§9's "second signal: exit 130").
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)
    # A handler may not have run yet for a signal that came just before the block.
    pending = len(signal.sigpending() & set(WATCHED))
    # The mask is this thread's only: a thread still alive (trio's cached worker
    # threads) can take the signal, and once the interpreter's finalization has put
    # the default action back, that kills the process (−15; the soak found it).
    # Ignored, a signal cannot; setting SIG_IGN also drops the pending ones, which
    # is why they were counted first. (Finalization leaves SIG_IGN as it is.)
    for signum in WATCHED:
        signal.signal(signum, signal.SIG_IGN)
    total = len(_received) + pending
    if code == 0 and total >= 2:
        return STOPPED_STATUS
    return code
