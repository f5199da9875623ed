"""A change notice: any number of tasks wait for "something changed", and one call
wakes them all. The harness's state (runs, connection, drain) is one: every part is
handed its ``notify``, and the beacon, status.json, the panel and ``wait_until`` wait
on it; a waiter re-checks what it cares about after every wake-up.

Notices are counted, so a waiter that looks at the state, then does other awaiting
work (writes a file, sleeps), and only then waits, does not lose a notice made in
between: it takes :meth:`Changes.seen` before the look and waits with
:meth:`Changes.wait_since`.
"""

from __future__ import annotations

import trio


class Changes:
    """Wakes every waiter once per :meth:`notify`; never blocks the notifier."""

    def __init__(self) -> None:
        self._event = trio.Event()
        self._count = 0

    def notify(self) -> None:
        """Count a notice and wake every task waiting now; later :meth:`wait` calls
        wait for the next notice (:meth:`wait_since` sees this one by its count)."""
        self._count += 1
        self._event.set()
        self._event = trio.Event()

    def seen(self) -> int:
        """How many notices there have been so far: take it before looking at the
        state, and hand it to :meth:`wait_since` after."""
        return self._count

    async def wait(self) -> None:
        """Return at the next :meth:`notify`. Cancelling it only stops the wait.

        A notice made before the call is not seen: use it only straight after a
        synchronous check of the state (no checkpoint between), else
        :meth:`wait_since`."""
        await self._event.wait()

    async def wait_since(self, count: int) -> None:
        """Return once there has been a notice after :meth:`seen` returned ``count``:
        at once (after a checkpoint) if one came already, else at the next one.

        Cancelled: raises ``trio.Cancelled`` (even if a notice had come) and
        consumes nothing; the count stays, so asking again with the same ``count``
        still sees that notice. A ``count`` above :meth:`seen` is a ``ValueError``.
        """
        if count > self._count:
            raise ValueError(f"count {count} is ahead of the notices ({self._count})")
        if count < self._count:
            # Still a checkpoint, as every trio wait: a caller looping on a stale
            # count yields to the others and can be cancelled.
            await trio.lowlevel.checkpoint()
            return
        await self._event.wait()
