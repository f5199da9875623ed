"""What the harness tells the server without being asked (docs/protocol.md §2).

On every connection: ``status`` first, then a ``heartbeat``; afterwards a
heartbeat every ``heartbeat_s`` (also with no runs: it is the harness's liveness)
and a ``status`` whenever ``active``, ``queued`` or ``draining`` changed, at most
one per 250 ms however fast things change. The ``seq`` of heartbeats counts up for
the life of the process, across connections.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from prohost.engine.changes import Changes
from prohost.engine.link.connection import Session
from prohost.wire.protocol import Heartbeat, RunBeat, Status

#: `status` is coalesced to at most one per this many seconds (§2).
STATUS_MIN_INTERVAL_S = 0.25


class Beacon:
    def __init__(self, status: Callable[[], Status], runs: Callable[[], list[RunBeat]],
                 changes: Changes) -> None:
        self._status = status
        self._runs = runs
        self._seq = 0
        #: Told when something a ``status`` reports may have changed.
        self._changes = changes
        #: trio time of the last heartbeat sent, if any.
        self.last_heartbeat_at: float | None = None

    def heartbeat(self) -> Heartbeat:
        self._seq += 1
        self.last_heartbeat_at = trio.current_time()
        return Heartbeat(seq=self._seq, runs=self._runs())

    async def serve(
        self, session: Session, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """For the life of one connection: status, heartbeat, then both as due.

        Reports started once the first status and heartbeat are sent, so that the
        link can hold back everything else until then (§1: they come first).
        Cancelled when the connection drops; there is nothing to clean up.
        """
        await session.send(self._status())
        await session.send(self.heartbeat())
        task_status.started()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._heartbeats, session)
            nursery.start_soon(self._statuses, session)

    async def _heartbeats(self, session: Session) -> None:
        while True:
            await trio.sleep(session.heartbeat_s)
            await session.send(self.heartbeat())

    async def _statuses(self, session: Session) -> None:
        since = self._changes.seen()
        last = self._status()
        while True:
            await self._changes.wait_since(since)
            since = self._changes.seen()
            status = self._status()
            if status == last:
                continue
            await session.send(status)
            last = status
            await trio.sleep(STATUS_MIN_INTERVAL_S)
