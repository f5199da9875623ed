"""A change notice: any number of tasks wait for "something changed", and one call
wakes them all. The harness's state (runs, connection, drain) and the status file's
writes are each one; a waiter re-checks what it cares about after every wake-up.
"""

from __future__ import annotations

import trio


class Changes:
    """Wakes every waiter once per :meth:`notify`; never blocks the notifier."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def notify(self) -> None:
        """Wake every task waiting now; later waiters wait for the next notice."""
        self._event.set()
        self._event = trio.Event()

    async def wait(self) -> None:
        """Return at the next :meth:`notify`. Cancelling it only stops the wait."""
        await self._event.wait()
