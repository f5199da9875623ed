"""A run's tool calls, posted to its timeline in batches (docs/protocol.md §8).

The brain's reader hands events over synchronously from the task reading the
agent's stdout, so :meth:`TimelineBatcher.add` only appends: the agent is never
slowed by the network. A separate task posts what has gathered at most every
500 ms. Before the run's completion is posted, :meth:`close` sends whatever is
left, so a thread never shows a tool still "calling" on a finished run.
"""

from __future__ import annotations

import logging

import trio

from prohost.engine.report.reporter import Reporter
from prohost.wire.timeline import ToolEvent

log = logging.getLogger("prohost.timeline")

#: Batches go out at most this often (§8).
BATCH_INTERVAL_S = 0.5
#: Events kept while the server is slow; older ones are dropped beyond this,
#: because a timeline is a courtesy and memory per run stays bounded.
MAX_PENDING = 2000
#: How long the last batch may take before the completion goes anyway.
CLOSE_TIMEOUT_S = 10.0


class TimelineBatcher:
    def __init__(self, reporter: Reporter, run_id: str, timeline_path: str) -> None:
        self._reporter = reporter
        self._run_id = run_id
        self._path = timeline_path
        self._pending: list[ToolEvent] = []
        self._dropped = 0
        self._wake = trio.Event()
        self._closing = False
        self._posted = trio.Event()

    def add(self, events: list[ToolEvent]) -> None:
        """Queue events for the next batch. Never blocks, never raises."""
        self._pending.extend(events)
        overflow = len(self._pending) - MAX_PENDING
        if overflow > 0:
            del self._pending[:overflow]
            self._dropped += overflow
        self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Post batches until :meth:`close` has flushed the last one.

        Cancelled: stops at once; events not yet posted are lost (the timeline is
        best effort), the run and its completion are unaffected.
        """
        task_status.started()
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                batch, self._pending = self._pending, []
                if batch:
                    await self._reporter.post_timeline(
                        self._run_id, self._path, [event.to_json() for event in batch]
                    )
                if self._closing and not self._pending:
                    return
                await trio.sleep(BATCH_INTERVAL_S)
        finally:
            # Also when cancelled (the second signal's deadline): close() must not
            # then wait its whole bound for a batch that will never be posted.
            self._posted.set()

    async def close(self) -> None:
        """Flush what is left and stop :meth:`run`; bounded, shielded (it runs while a
        cancelled run is being reported)."""
        if self._dropped:
            log.warning("run %s: %d timeline events were dropped while the server was slow",
                        self._run_id, self._dropped)
        self._closing = True
        self._wake.set()
        with trio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
            await self._posted.wait()
