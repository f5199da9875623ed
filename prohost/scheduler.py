"""Which accepted runs execute now, and which wait (PROTOCOL.md §4).

The rule that protects an answer: **two runs on one lane never overlap, and they
start in the order they arrived.** A lane is a conversation; each turn resumes the
agent session the previous turn left, so two turns side by side would both resume
the same session and the second would answer without having seen the first. Runs on
different lanes share nothing but the machine, and those may overlap, up to a limit.

Among the runs free to start, the one accepted first goes first, and a busy lane
never holds up the lanes behind it: a quick question in one thread does not wait out
a two-hour job in another.

The TypeScript original found the next run by scanning every pending run for the
first whose lane was free. That is O(n) per dispatch, and it degrades exactly when
it matters: a busy conversation with a backlog puts its runs at the front of the
list, and every dispatch walks past all of them. Here each lane keeps its own FIFO
queue, and a heap holds only the *ready* lanes (free, with something queued) keyed
by the accept sequence of the lane's head. The heap's minimum is, by construction,
the oldest run whose lane is free, so submit and dispatch cost O(log lanes) and
never look at a run that cannot start.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import attrs
import trio

__all__ = [
    "MAX_CONCURRENCY",
    "DrainingError",
    "LaneQueue",
    "Scheduler",
    "SchedulerStatistics",
]

T = TypeVar("T")

#: Most runs one harness executes at once, whatever the flag says (§4).
MAX_CONCURRENCY = 16

_log = logging.getLogger(__name__)


class DrainingError(RuntimeError):
    """``submit`` after ``drain``: the harness is shutting down and starts nothing new."""


@attrs.define(slots=True, eq=False)
class _Entry(Generic[T]):
    seq: int
    key: str
    lane: str
    item: T
    removed: bool = False


class LaneQueue(Generic[T]):
    """Per-lane FIFO queues plus a heap of ready lanes. Pure data structure, no trio.

    Invariants (checked by the tests through behaviour, relied on below):

    * a lane has at most one heap entry, and ``_heaped`` is exactly the set of
      lanes that have one (``drain`` clears both together);
    * every lane that is free and has a live queued entry has a heap entry, keyed
      by a sequence number at most that of the lane's head (less only after the
      head was removed: see ``pop_ready`` for how that entry is repaired lazily);
    * a busy lane has no heap entry, so its backlog costs the heap nothing;
    * ``_by_key`` holds exactly the live queued entries, in accept order (dicts
      keep insertion order, and a key is inserted once, at push).
    """

    def __init__(self) -> None:
        self._seq = 0
        self._lanes: dict[str, deque[_Entry[T]]] = {}
        self._by_key: dict[str, _Entry[T]] = {}
        # lane -> key of the item running on it.
        self._busy: dict[str, str] = {}
        self._running_keys: set[str] = set()
        self._heap: list[tuple[int, str]] = []
        # Lanes with an entry in _heap: the guard that keeps it to one per lane.
        self._heaped: set[str] = set()

    @property
    def queued(self) -> int:
        """Items waiting (not running, not removed)."""
        return len(self._by_key)

    @property
    def running(self) -> int:
        """Items popped and not yet released: the number of busy lanes."""
        return len(self._busy)

    def __contains__(self, key: object) -> bool:
        """True while the key is queued or running (popped and not yet released)."""
        return key in self._by_key or key in self._running_keys

    def __len__(self) -> int:
        return len(self._by_key) + len(self._busy)

    def push(self, key: str, lane: str, item: T) -> None:
        """Queue ``item`` on ``lane``. Accept order is push order. O(log lanes).

        Raises ``ValueError`` if ``key`` is already queued or running: the key is
        the run id, and running one run twice is the thing the ledger exists to stop.
        """
        if key in self:
            raise ValueError(f"{key!r} is already queued or running")
        entry = _Entry(self._seq, key, lane, item)
        self._seq += 1
        queue = self._lanes.get(lane)
        if queue is None:
            queue = self._lanes[lane] = deque()
        queue.append(entry)
        self._by_key[key] = entry
        if lane not in self._busy and lane not in self._heaped:
            self._heaped.add(lane)
            heapq.heappush(self._heap, (entry.seq, lane))

    def pop_ready(self) -> tuple[str, str, T] | None:
        """Take the oldest-accepted item whose lane is free and mark that lane busy.

        Returns ``(key, lane, item)``, or ``None`` when every queued item waits on a
        busy lane (or nothing is queued). Amortised O(log lanes).
        """
        heap = self._heap
        while heap:
            seq, lane = heapq.heappop(heap)
            self._heaped.remove(lane)
            queue = self._live_queue(lane)
            if queue is None:
                continue
            head = queue[0]
            if head.seq != seq:
                # The head this entry was keyed by was removed. The new head is
                # younger, so it goes back in at its own place; nothing older than
                # this entry is left in the heap, so no order was broken by
                # popping it early.
                self._heaped.add(lane)
                heapq.heappush(heap, (head.seq, lane))
                continue
            queue.popleft()
            del self._by_key[head.key]
            self._busy[lane] = head.key
            self._running_keys.add(head.key)
            return head.key, lane, head.item
        return None

    def release(self, lane: str) -> None:
        """The item running on ``lane`` finished: the lane's next item becomes ready.

        Raises ``KeyError`` if nothing runs on ``lane``.
        """
        key = self._busy.pop(lane)
        self._running_keys.discard(key)
        queue = self._live_queue(lane)
        if queue is not None:
            self._heaped.add(lane)
            heapq.heappush(self._heap, (queue[0].seq, lane))

    def remove(self, key: str) -> T | None:
        """Take a queued (not running) item out. ``None`` if it isn't queued.

        Amortised O(1): the entry is only marked; it leaves its lane's deque when
        it reaches the front, and a heap entry keyed by it is repaired at pop time.
        """
        entry = self._by_key.pop(key, None)
        if entry is None:
            return None
        entry.removed = True
        # Trimming a removed head now keeps a cancelled backlog from pinning memory.
        self._live_queue(entry.lane)
        return entry.item

    def drain(self) -> list[tuple[str, T]]:
        """Remove and return every queued item, in accept order. Running items stay."""
        items = [(entry.key, entry.item) for entry in self._by_key.values()]
        self._by_key.clear()
        self._lanes.clear()
        self._heap.clear()
        self._heaped.clear()
        return items

    def _live_queue(self, lane: str) -> deque[_Entry[T]] | None:
        """The lane's deque with removed entries trimmed off its front, or None if empty.

        An empty deque is dropped so that ``_lanes`` only grows with lanes that
        have something queued: over a long life a harness sees many conversations.
        """
        queue = self._lanes.get(lane)
        if queue is None:
            return None
        while queue and queue[0].removed:
            queue.popleft()
        if not queue:
            del self._lanes[lane]
            return None
        return queue


@attrs.frozen
class SchedulerStatistics:
    """A snapshot of a :class:`Scheduler`, in the manner of trio's ``statistics()``."""

    limit: int
    running: int
    queued: int
    draining: bool


class Scheduler(Generic[T]):
    """Trio driver for a :class:`LaneQueue`: runs ``work(key, item)`` for ready items,
    at most ``limit`` at once, each in its own task in the nursery of :meth:`run`.

    ``submit`` is synchronous on purpose: the socket reader calls it between an
    ack and the next frame and must never wait on a run.
    """

    def __init__(self, limit: int, work: Callable[[str, T], Awaitable[None]]) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"limit must be an int, got {limit!r}")
        if not 1 <= limit <= MAX_CONCURRENCY:
            raise ValueError(f"limit must be from 1 to {MAX_CONCURRENCY}, got {limit}")
        self._limit = limit
        self._work = work
        self._queue: LaneQueue[T] = LaneQueue()
        self._draining = False
        # Set whenever something may have become startable; the dispatcher swaps
        # in a fresh one before each pass, so a wake-up is never lost.
        self._wake = trio.Event()
        # Set while idle; replaced by a fresh one when work arrives.
        self._idle = trio.Event()
        self._idle.set()

    @property
    def limit(self) -> int:
        return self._limit

    def __contains__(self, key: object) -> bool:
        """True while ``key`` is queued or running."""
        return key in self._queue

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Dispatch ready items until cancelled. Start it with ``nursery.start``.

        Work tasks live in this coroutine's own nursery, so cancelling ``run``
        cancels every running ``work`` call (and waits for each to finish its own
        shielded cleanup) and starts nothing new; items still queued stay queued,
        for :meth:`drain` to hand back. It never returns otherwise.
        """
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                self._wake = trio.Event()
                self._dispatch(nursery)
                await self._wake.wait()

    def _dispatch(self, nursery: trio.Nursery) -> None:
        # No draining check needed: drain() empties the queue and submit() refuses
        # while draining, so there is nothing left to start.
        queue = self._queue
        while queue.running < self._limit:
            ready = queue.pop_ready()
            if ready is None:
                return
            key, lane, item = ready
            nursery.start_soon(self._execute, key, lane, item, name=f"scheduler work {key}")

    async def _execute(self, key: str, lane: str, item: T) -> None:
        try:
            await self._work(key, item)
        except Exception:
            # The caller reports its own failures; this only keeps one broken run
            # from taking the scheduler (and every other run) down with it, or
            # from leaving its lane busy forever.
            _log.exception("work for %s on lane %s raised", key, lane)
        finally:
            self._queue.release(lane)
            self._wake.set()
            self._check_idle()

    def submit(self, key: str, lane: str, item: T) -> None:
        """Queue ``item`` on ``lane``; it starts once a slot and its lane are free.

        Never blocks. Raises ``ValueError`` for a key already queued or running,
        and :class:`DrainingError` after :meth:`drain`.
        """
        if self._draining:
            raise DrainingError(f"the scheduler is draining; {key!r} was not queued")
        self._queue.push(key, lane, item)
        if self._idle.is_set():
            self._idle = trio.Event()
        self._wake.set()

    def remove(self, key: str) -> T | None:
        """Take a queued item out (a cancelled run). ``None`` if it isn't queued:
        a running item is stopped by its own cancel scope, not here."""
        item = self._queue.remove(key)
        if item is not None:
            self._check_idle()
        return item

    def drain(self) -> list[tuple[str, T]]:
        """Stop starting new work and hand back every queued item, in accept order.

        Running items go on to finish; later ``submit`` calls raise
        :class:`DrainingError`.
        """
        self._draining = True
        items = self._queue.drain()
        self._check_idle()
        return items

    def statistics(self) -> SchedulerStatistics:
        """A frozen snapshot: limit, running, queued, draining."""
        return SchedulerStatistics(
            limit=self._limit,
            running=self._queue.running,
            queued=self._queue.queued,
            draining=self._draining,
        )

    async def wait_idle(self) -> None:
        """Return once nothing runs and nothing is queued.

        Cancelling it only stops the wait; the scheduler is unaffected.
        """
        while len(self._queue):
            await self._idle.wait()

    def _check_idle(self) -> None:
        if not len(self._queue):
            self._idle.set()
