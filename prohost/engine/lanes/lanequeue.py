"""Per-lane FIFO queues and a heap of ready lanes: which pending run may start next.

The TypeScript original found the next run by scanning every pending run for the
first whose lane was free. That is O(n) per dispatch, and it degrades exactly when
it matters: a busy conversation with a backlog puts its runs at the front of the
list, and every dispatch walks past all of them. Here each lane keeps its own FIFO
queue, and a heap holds only the *ready* lanes (free, with something queued) keyed
by the accept sequence of the lane's head. The heap's minimum is, by construction,
the oldest run whose lane is free, so submit and dispatch cost O(log lanes) and
never look at a run that cannot start.

An entry is one of two kinds. A run needs a concurrency slot to start; a run that
only needs reporting (*slotless*: it finished before a restart, was cancelled while
queued, or was drained) needs its lane and nothing else. Ready lanes whose head is
slotless wait in a heap of their own, so that they start while every slot is taken.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Generic, TypeVar

import attrs

__all__ = ["Entry", "LaneQueue"]

T = TypeVar("T")


@attrs.define(slots=True, eq=False)
class Entry(Generic[T]):
    """One pending run: its accept sequence, key (run id), lane and payload; and
    whether it starts without a slot (a run that only needs reporting)."""

    seq: int
    key: str
    lane: str
    item: T
    removed: bool = False
    slotless: bool = False


class LaneQueue(Generic[T]):
    """Per-lane FIFO queues plus a heap of ready lanes. Pure data structure, no trio.

    Invariants (checked by the tests through behaviour, relied on below):

    * a lane has at most one live heap entry, in ``_heap`` or in ``_quick`` as
      ``_heaped[lane]`` says (an entry in the other heap is stale and skipped);
    * every lane that is free and has a live queued entry has a heap entry, keyed
      by a sequence number at most that of the lane's head (less only after the
      head was removed: see ``pop_ready`` for how that entry is repaired lazily),
      in ``_quick`` when its head is slotless (kept so by :meth:`_refresh` when a
      head changes kind), else in ``_heap``;
    * a busy lane has no heap entry, so its backlog costs the heap nothing;
    * a held lane (:meth:`hold`) is never busy, and any heap entry it has is
      dropped when popped and made again by :meth:`unhold`;
    * ``_by_key`` holds exactly the live queued entries, in accept order (dicts
      keep insertion order, and a key is inserted once, at push).
    """

    def __init__(self) -> None:
        self._seq = 0
        # lane -> its queued entries: the entry itself while it is the only one (the
        # common case, one turn waiting per conversation), a deque once there are
        # more. An empty deque costs about 600 bytes; 10,000 queued conversations
        # would spend 6 MiB on them.
        self._lanes: dict[str, Entry[T] | deque[Entry[T]]] = {}
        self._by_key: dict[str, Entry[T]] = {}
        # lane -> key of the item running on it.
        self._busy: dict[str, str] = {}
        self._running_keys: set[str] = set()
        # Ready lanes whose head needs a slot, and those whose head does not.
        self._heap: list[tuple[int, str]] = []
        self._quick: list[tuple[int, str]] = []
        # Lanes with a live heap entry -> whether it is in _quick: the guard that
        # keeps it to one per lane.
        self._heaped: dict[str, bool] = {}
        # Live queued entries that are slotless.
        self._slotless = 0
        # Lanes kept from starting anything while someone else works on them.
        self._held: set[str] = set()

    @property
    def queued(self) -> int:
        """Items waiting (not running, not removed), of both kinds."""
        return len(self._by_key)

    @property
    def queued_slotless(self) -> int:
        """Of :attr:`queued`, the slotless items (runs that only need reporting)."""
        return self._slotless

    @property
    def running(self) -> int:
        """Items popped and not yet released: the number of busy lanes."""
        return len(self._busy)

    @property
    def held(self) -> int:
        """Lanes held (:meth:`hold`)."""
        return len(self._held)

    def is_free(self, lane: str) -> bool:
        """Nothing runs on ``lane``, it is not held, and none of its items wait."""
        return lane not in self._busy and lane not in self._held and lane not in self._lanes

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
        self.push_entry(Entry(0, key, lane, item))  # seq is set there

    def push_entry(self, entry: Entry[T]) -> None:
        """:meth:`push` for an entry made beforehand (its ``seq`` is set here), whose
        key the caller knows is neither queued nor running."""
        key, lane = entry.key, entry.lane
        entry.seq = self._seq
        self._seq += 1
        queued = self._lanes.get(lane)
        if queued is None:
            self._lanes[lane] = entry
        elif isinstance(queued, Entry):
            self._lanes[lane] = deque((queued, entry))
        else:
            queued.append(entry)
        self._by_key[key] = entry
        if entry.slotless:
            self._slotless += 1
        if lane not in self._busy and lane not in self._held and lane not in self._heaped:
            self._push_ready(lane, entry)

    def pop_ready(self, slot_free: bool = True) -> Entry[T] | None:
        """Take an item whose lane is free and mark that lane busy: a slotless one
        first (it takes nothing from other lanes), else, if ``slot_free``, the
        oldest-accepted one.

        Returns its entry, or ``None`` when every queued item waits on a busy lane
        or for a slot (or nothing is queued). Amortised O(log lanes).
        """
        while True:
            quick = bool(self._quick)
            if quick:
                heap = self._quick
            elif slot_free and self._heap:
                heap = self._heap
            else:
                return None
            seq, lane = heapq.heappop(heap)
            if self._heaped.get(lane) is not quick:
                continue  # stale: the lane's live entry is in the other heap, or none
            del self._heaped[lane]
            if self._held and lane in self._held:
                continue  # unhold() puts it back
            head = self._head(lane)
            if head is None:
                continue
            if head.seq != seq or head.slotless is not quick:
                # The head this entry was keyed by was removed. The new head is
                # younger, so it goes back in at its own place (in the heap of
                # its kind); nothing older than this entry is left in the heap,
                # so no order was broken by popping it early.
                self._push_ready(lane, head)
                continue
            self._pop_head(lane)
            del self._by_key[head.key]
            if head.slotless:
                self._slotless -= 1
            self._busy[lane] = head.key
            self._running_keys.add(head.key)
            return head

    def release(self, lane: str) -> None:
        """The item running on ``lane`` finished: the lane's next item becomes ready.

        Raises ``KeyError`` if nothing runs on ``lane``.
        """
        key = self._busy.pop(lane)
        self._running_keys.discard(key)
        # _make_ready, inlined: this runs once per run. A busy lane has no heap entry.
        head = self._head(lane)
        if head is not None:
            self._push_ready(lane, head)

    def hold(self, lane: str) -> bool:
        """Keep ``lane`` from starting anything until :meth:`unhold`; its queued items
        stay queued. False (and nothing changes) while an item runs on it or it is
        already held."""
        if lane in self._busy or lane in self._held:
            return False
        self._held.add(lane)
        return True

    def unhold(self, lane: str) -> None:
        """End a :meth:`hold`: the lane's oldest item becomes ready again.

        Raises ``KeyError`` if ``lane`` is not held.
        """
        self._held.remove(lane)
        self._make_ready(lane)

    def _make_ready(self, lane: str) -> None:
        # Called when the lane has just become free (nothing runs on it, not held).
        if lane in self._heaped:
            self._refresh(lane)  # a held lane's entry can still be there, not yet popped
            return
        head = self._head(lane)
        if head is not None:
            self._push_ready(lane, head)

    def _push_ready(self, lane: str, head: Entry[T]) -> None:
        # ``lane`` is free with ``head`` first: its one live heap entry, by kind.
        self._heaped[lane] = head.slotless
        heapq.heappush(self._quick if head.slotless else self._heap, (head.seq, lane))

    def _refresh(self, lane: str) -> None:
        # A ready lane's head may have changed kind (made slotless, or removed with
        # one of the other kind behind it): its live entry moves to the heap of the
        # new head's kind, the old one left stale. Else a slotless head would wait
        # for a slot, or a run would start without one.
        quick = self._heaped.get(lane)
        if quick is None:
            return
        head = self._head(lane)
        if head is not None and head.slotless is not quick:
            self._push_ready(lane, head)

    def make_slotless(self, key: str, item: T) -> bool:
        """Turn the queued item ``key`` into the slotless ``item``, in its place: it
        keeps its turn in its lane. False (nothing changes) if it isn't queued."""
        entry = self._by_key.get(key)
        if entry is None:
            return False
        entry.item = item
        if not entry.slotless:
            entry.slotless = True
            self._slotless += 1
            self._refresh(entry.lane)
        return True

    def remove(self, key: str) -> T | None:
        """Take a queued (not running) item out. ``None`` if it isn't queued.

        Amortised O(1): the entry is only marked; it leaves its lane's deque when
        it reaches the front, and a heap entry keyed by it is repaired at pop time.
        """
        entry = self._by_key.pop(key, None)
        if entry is None:
            return None
        entry.removed = True
        if entry.slotless:
            self._slotless -= 1
        # Trimming a removed head now keeps a cancelled backlog from pinning memory.
        self._head(entry.lane)
        self._refresh(entry.lane)
        return entry.item

    def drain(self) -> list[tuple[str, T]]:
        """Remove and return every queued item that needs a slot, in accept order.
        Running items stay, and so do slotless ones: they are still to be reported."""
        items = [(entry.key, entry.item) for entry in self._by_key.values()
                 if not entry.slotless]
        if not self._slotless:
            self._by_key.clear()
            self._lanes.clear()
            self._heap.clear()
            self._quick.clear()
            self._heaped.clear()
            return items
        for key, _item in items:
            entry = self._by_key.pop(key)
            entry.removed = True
        for lane in list(self._heaped):
            self._head(lane)
            self._refresh(lane)
        return items

    def _head(self, lane: str) -> Entry[T] | None:
        """The lane's oldest live entry, with removed entries trimmed off its front, or
        None if it has none.

        A lane with nothing queued is dropped so that ``_lanes`` only grows with lanes
        that have something queued: over a long life a harness sees many conversations.
        """
        queued = self._lanes.get(lane)
        if queued is None:
            return None
        if isinstance(queued, Entry):
            if queued.removed:
                del self._lanes[lane]
                return None
            return queued
        while queued and queued[0].removed:
            queued.popleft()
        if not queued:
            del self._lanes[lane]
            return None
        return queued[0]

    def _pop_head(self, lane: str) -> None:
        # The caller has just had the lane's head from _head, so the lane has one.
        queued = self._lanes[lane]
        if isinstance(queued, Entry):
            del self._lanes[lane]
        else:
            queued.popleft()
