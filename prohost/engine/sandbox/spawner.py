"""A thread that enters a run's Landlock domain ahead of its spawn: :class:`Spawner`.

A confined spawn is made from a thread in the domain (never from the child: see
:meth:`~.confinement.Confinement.spawn_from_a_confined_thread`), and such a thread
can never leave it, so it is a fresh one. Made at the spawn, that thread costs the
spawn its start, its entering and its join (a few tenths of a millisecond, issue
29's cost). A :class:`Spawner` is that thread started earlier, while the run has
other things to wait for (its ``started`` fsync): it enters the domain at once, then
waits for its one spawn, hands the result back through a callback, and ends. A
spawner that is never asked ends after :data:`WAIT_S`, or when it is closed; either
way the spawn is then made the usual way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from prohost.engine.sandbox import landlock

#: How long a spawner waits for its spawn before it ends unused (s). A run's steps
#: between its confinement and its spawn take milliseconds; one that takes longer
#: spawns the usual way.
WAIT_S = 60.0
#: The bound on joining it: it is waiting (woken by the close) or has just delivered.
JOIN_S = 1.0

#: Called with ``start()``'s result and ``None``, or ``None`` and what it raised.
Deliver = Callable[[Any, BaseException | None], None]


class Spawner:
    """One thread in the domain of ``ruleset_fd``, waiting for one spawn; the
    caller keeps the ruleset open until :meth:`close`."""

    def __init__(self, ruleset_fd: int) -> None:
        self._lock = threading.Lock()
        self._asked = threading.Event()
        self._job: tuple[Callable[[], Any], Deliver] | None = None
        #: It has taken its job, or will take none (expired or closed).
        self._over = False
        self._thread = threading.Thread(target=self._serve, args=(ruleset_fd,),
                                        name="prohost-confined-spawn")
        self._thread.start()

    def give(self, start: Callable[[], Any], deliver: Deliver) -> bool:
        """Have the thread call ``start()`` and then ``deliver`` its result or error
        (from that thread; an ``OSError`` without ``start`` called when the domain
        could not be entered). ``False``, and nothing happens, when it takes no job any
        more: the caller spawns the usual way. Never blocks."""
        with self._lock:
            if self._over or self._job is not None:
                return False
            self._job = (start, deliver)
        self._asked.set()
        return True

    def close(self) -> None:
        """End it (unless it has a job, which it finishes and delivers first) and
        join it, within :data:`JOIN_S`."""
        self._asked.set()
        self._thread.join(JOIN_S)

    def _serve(self, ruleset_fd: int) -> None:
        try:
            landlock.restrict_this_thread(ruleset_fd)
        except OSError as error:
            failure: OSError | None = error
        else:
            failure = None
        self._asked.wait(WAIT_S)
        with self._lock:
            job, self._over = self._job, True
        if job is None:
            return
        start, deliver = job
        if failure is not None:
            deliver(None, failure)
            return
        try:
            result = start()
        except BaseException as error:  # handed to the caller's thread
            deliver(None, error)
        else:
            deliver(result, None)
