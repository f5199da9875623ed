"""A thread that enters a run's Landlock domain ahead of its spawn: :class:`Spawner`.

A confined spawn is made from a thread in the domain (never from the child: see
:meth:`~.confinement.Confinement.spawn_from_a_confined_thread`), and such a thread
can never leave it, so it is a fresh one. Made at the spawn, that thread costs the
spawn its start, its entering and its join (a few tenths of a millisecond, issue
29's cost). A :class:`Spawner` is that thread started earlier: it enters the domain
at once, then runs the jobs it is given, one at a time, each result handed back
through a callback, and ends after its last one (the spawn). A confinement made
ahead, while the harness is idle, has its spawner waiting with it, and the run
that takes it has it check first that its rules are still right (a few ``stat``
calls, which the domain does not restrict), so that a run's start costs no thread
at all. A spawner with nothing to do ends after its wait, or when it is closed;
the spawn is then made the usual way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import attrs

from prohost.engine.sandbox import landlock

#: How long a spawner waits for its next job before it ends unused (s). A run's
#: steps between its confinement and its spawn take milliseconds; one that takes
#: longer spawns the usual way.
WAIT_S = 60.0
#: The bound on joining it: it is waiting (woken by the close) or has just delivered.
JOIN_S = 1.0

#: Called with the job's result and ``None``, or ``None`` and what it raised.
Deliver = Callable[[Any, BaseException | None], None]


@attrs.frozen
class _Job:
    run: Callable[[], Any]
    deliver: Deliver
    #: The spawn: the thread ends once it is done.
    last: bool


class Spawner:
    """One thread in the domain of ``ruleset_fd`` running the jobs it is given;
    the caller keeps the ruleset open until :meth:`close`. ``first_wait_s``: how
    long it waits for its first job (``None``: until closed, for a confinement
    made ahead)."""

    def __init__(self, ruleset_fd: int, *, first_wait_s: float | None = WAIT_S) -> None:
        self._lock = threading.Lock()
        self._asked = threading.Event()
        self._job: _Job | None = None
        #: It takes no job any more (done, expired or closed).
        self._over = False
        self._thread = threading.Thread(target=self._serve, args=(ruleset_fd, first_wait_s),
                                        name="prohost-confined-spawn")
        self._thread.start()

    def give(self, job: Callable[[], Any], deliver: Deliver, *, last: bool = True) -> bool:
        """Have the thread call ``job()`` and then ``deliver`` its result or error
        (from that thread; an ``OSError`` without ``job`` called when the domain
        could not be entered). ``last``: the thread ends after it. ``False``, and
        nothing happens, when it takes no job now (busy, done, expired or closed):
        the caller does without it. Never blocks."""
        with self._lock:
            if self._over or self._job is not None:
                return False
            self._job = _Job(job, deliver, last)
        self._asked.set()
        return True

    def close(self) -> None:
        """End it (a job it has begun is finished and delivered first) and join
        it, within :data:`JOIN_S`."""
        with self._lock:
            self._over = True
        self._asked.set()
        self._thread.join(JOIN_S)

    def _serve(self, ruleset_fd: int, wait_s: float | None) -> None:
        try:
            landlock.restrict_this_thread(ruleset_fd)
        except OSError as error:
            failure: OSError | None = error
        else:
            failure = None
        while True:
            self._asked.wait(wait_s)
            with self._lock:
                job, self._job = self._job, None
                self._asked.clear()
                if job is None or job.last or failure is not None:
                    self._over = True
            if job is None:
                return  # closed, or nothing came in time
            if failure is not None:
                job.deliver(None, failure)
                return
            try:
                result = job.run()
            except BaseException as error:  # handed to the caller's thread
                job.deliver(None, error)
            else:
                job.deliver(result, None)
            with self._lock:
                if self._over:  # its last job, or closed while it ran
                    return
            wait_s = WAIT_S
