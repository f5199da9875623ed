"""Which run goes out next: the reference server's delivery queues and timers.

The server once scanned every offered run on every change and pushed every due
delivery into one connection's outbox at once; with thousands of runs waiting
that overflowed the outbox, the harness was dropped as "not reading", and the
same happened on every reconnect (a livelock). Here a run waits in one of three
places, and every step costs O(1) or O(log n):

- ``waiting``: a FIFO of runs due now and not yet given to a connection;
- ``parked[token]``: runs that must go to one harness (an unacked delivery going
  back, or a conversation that lives there) while that harness's window is full;
- ``timers``: a heap of (due time, run) for resends of unacked deliveries and the
  delayed retry after a 503.

Entries are never removed in the middle: a run that was withdrawn (acked,
cancelled, completed) or rescheduled is skipped when its entry comes up, which
the caller checks against the run's own ``due_at``.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Iterable


class DeliveryQueue:
    """The waiting FIFO, the per-harness parking lots and the timer heap."""

    def __init__(self) -> None:
        self._waiting: deque[str] = deque()
        self._queued: set[str] = set()
        self._parked: dict[str, deque[str]] = {}
        self._timers: list[tuple[float, int, str]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._waiting) + sum(len(q) for q in self._parked.values())

    # ---------------------------------------------------------------- waiting

    def push(self, run_id: str, *, front: bool = False) -> None:
        """Make ``run_id`` due now; a run already waiting keeps its place."""
        if run_id in self._queued:
            return
        self._queued.add(run_id)
        if front:
            self._waiting.appendleft(run_id)
        else:
            self._waiting.append(run_id)

    def pop(self) -> str | None:
        """The oldest waiting run, or None."""
        if not self._waiting:
            return None
        run_id = self._waiting.popleft()
        self._queued.discard(run_id)
        return run_id

    def push_back_first(self, run_id: str) -> None:
        """Return a run just popped to the head (no connection can take it yet)."""
        self.push(run_id, front=True)

    # ---------------------------------------------------------------- parked

    def park(self, token: str, run_id: str) -> None:
        """``run_id`` waits for harness ``token``'s window to open."""
        self._parked.setdefault(token, deque()).append(run_id)

    def parked_tokens(self) -> list[str]:
        return [token for token, runs in self._parked.items() if runs]

    def parked_count(self, token: str) -> int:
        return len(self._parked.get(token, ()))

    def unpark(self, token: str) -> str | None:
        """The oldest run parked for ``token``, or None."""
        runs = self._parked.get(token)
        if not runs:
            return None
        run_id = runs.popleft()
        if not runs:
            del self._parked[token]
        return run_id

    def release(self, token: str) -> None:
        """``token`` has no connection left: its parked runs wait for anyone, first."""
        runs = self._parked.pop(token, None)
        for run_id in reversed(runs or ()):
            self.push(run_id, front=True)

    # ---------------------------------------------------------------- timers

    def schedule(self, run_id: str, at: float) -> None:
        heapq.heappush(self._timers, (at, next(self._order), run_id))

    def due(self, now: float) -> Iterable[tuple[str, float]]:
        """Pop every timer at or before ``now``: (run_id, the time it was set for)."""
        while self._timers and self._timers[0][0] <= now:
            at, _, run_id = heapq.heappop(self._timers)
            yield run_id, at

    def next_timer(self) -> float:
        """When the earliest timer falls due (``inf`` when none)."""
        return self._timers[0][0] if self._timers else math.inf
