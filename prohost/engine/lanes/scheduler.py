"""Which accepted runs execute now, and which wait (docs/protocol.md §4).

The rule that protects an answer: **two runs on one lane never overlap, and they
start in the order they arrived.** A lane is a conversation; each turn resumes the
agent session the previous turn left, so two turns side by side would both resume
the same session and the second would answer without having seen the first. Runs on
different lanes share nothing but the machine, and those may overlap, up to a limit.

Among the runs free to start, the one accepted first goes first, and a busy lane
never holds up the lanes behind it: a quick question in one thread does not wait out
a two-hour job in another.

The pending runs themselves are kept in a :class:`prohost.engine.lanes.lanequeue.LaneQueue`,
which finds the next one in O(log lanes); this module is its trio driver: slots,
work tasks, drain and lane holds.

Every run goes through the lanes one way, as one of two kinds of item: a run to
execute (:meth:`Scheduler.submit`), which also takes a :class:`Slot`, and a run
that only needs reporting (:meth:`Scheduler.settle`: it finished before a restart,
was cancelled while queued, or will not start because the harness drains), which
waits for its lane and for nothing else.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Generic, TypeVar

import attrs
import trio

from prohost.engine.lanes.lanequeue import Entry, LaneQueue
from prohost.wire.intake import MAX_QUEUED_RUNS

__all__ = [
    "MAX_CONCURRENCY",
    "QUEUE_CAP",
    "DrainingError",
    "QueueFullError",
    "Scheduler",
    "SchedulerStatistics",
    "Slot",
]

T = TypeVar("T")

#: Most runs one harness executes at once, whatever the flag says (§4).
MAX_CONCURRENCY = 16
#: Most runs queued at once, in runs (§3): at this many, intake answers new
#: deliveries 503 "queue full", so a runaway server cannot exhaust memory. The
#: harness passes its ``--max-queued``; this is the default and the most.
QUEUE_CAP = MAX_QUEUED_RUNS

_log = logging.getLogger("prohost.scheduler")


class DrainingError(RuntimeError):
    """``submit`` after ``drain``: the harness is shutting down and starts nothing new."""


class QueueFullError(RuntimeError):
    """``submit`` with ``queue_cap`` items already on their way in (§3's queue cap)."""


class Slot:
    """One run's concurrency slot (§4), handed to its ``work``.

    The slot is for the agent: the run gives it back itself with :meth:`release`
    once its agent has ended and its outcome is durable, so another lane may start
    while this one is still being reported (its lane stays busy until ``work``
    returns). Whatever the run does, the scheduler releases it when ``work``
    returns, a cancel included. A run that only needs reporting is handed one that
    holds nothing.
    """

    __slots__ = ("_key", "_scheduler")

    def __init__(self, scheduler: Scheduler[Any] | None, key: str) -> None:
        self._scheduler = scheduler
        self._key = key

    @property
    def held(self) -> bool:
        """Whether this slot is still taken from the limit."""
        return self._scheduler is not None

    def release(self) -> bool:
        """Give the slot back now; True if this call did. Idempotent; never blocks."""
        scheduler, self._scheduler = self._scheduler, None
        if scheduler is None:
            return False
        scheduler._slot_freed(self._key)
        return True


@attrs.frozen
class SchedulerStatistics:
    """A snapshot of a :class:`Scheduler`, in the manner of trio's ``statistics()``.

    ``limit`` and ``running`` are the slot limiter's figures (its total and
    borrowed tokens): runs preparing or executing. ``queued`` counts the runs
    waiting to execute. ``reporting`` counts runs whose agent has ended, or which
    only needed reporting, and which still hold their lane until their report
    settles; ``waiting_reports``, those of the latter still waiting for their lane.
    """

    limit: int
    running: int
    queued: int
    draining: bool
    reporting: int = 0
    held_lanes: int = 0
    waiting_reports: int = 0


class Scheduler(Generic[T]):
    """Trio driver for a :class:`LaneQueue`: runs ``work(key, item, slot)`` for ready
    items, each in its own task in the nursery of :meth:`run`.

    The shape (the design card's): submitted items come in through a trio memory
    channel; a task moves them into the per-lane FIFOs; each run takes one token of
    a ``trio.CapacityLimiter(limit)`` (a *slot*) when it starts. The slot is for
    the agent: ``work`` gives it back early (:meth:`Slot.release`) once its agent
    has ended and the outcome is durable, while the item keeps its lane until
    ``work`` returns (its report settled), so a lane's results still go out in
    order and a failing completion endpoint does not idle the machine (§4). A
    settled item (:meth:`settle`) takes no slot: it starts once its lane is free.

    ``submit`` and ``settle`` are synchronous on purpose: the socket reader calls
    them between an ack and the next frame and must never wait on a run.
    """

    def __init__(
        self,
        limit: int,
        work: Callable[[str, T, Slot], Awaitable[None]],
        *,
        queue_cap: int = QUEUE_CAP,
    ) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"limit must be an int, got {limit!r}")
        if not 1 <= limit <= MAX_CONCURRENCY:
            raise ValueError(f"limit must be from 1 to {MAX_CONCURRENCY}, got {limit}")
        if queue_cap < 1:
            raise ValueError(f"queue_cap must be at least 1, got {queue_cap}")
        self._limiter = trio.CapacityLimiter(limit)
        self._work = work
        self._queue: LaneQueue[T] = LaneQueue()
        # The reader never blocks on this channel: it uses send_nowait, and the
        # channel is sized by the queue cap. Intake answers 503 "queue full" once
        # QUEUE_CAP runs are queued (§3, the harness's intake), so a channel of
        # that size always has room; were it ever full, submit raises
        # QueueFullError rather than wait.
        self._send, self._receive = trio.open_memory_channel[Entry[T]](queue_cap)
        # Sent and not yet taken into the LaneQueue, in submit order: still
        # queued as far as remove, drain and statistics are concerned. The entry
        # that goes through the channel is the one the LaneQueue keeps (one object
        # per run); marked ``removed`` if withdrawn (removed or drained) on the way.
        self._in_channel: dict[str, Entry[T]] = {}
        # Of those, the ones settled on the way (made slotless in place).
        self._channel_slotless = 0
        self._draining = False
        # Set whenever something may have become startable; the dispatcher swaps
        # in a fresh one before each pass, so a wake-up is never lost.
        self._wake = trio.Event()
        # lane -> the holding() calls waiting for it, first come first served. A lane
        # let go is handed to the first of them before any run can take it.
        self._hold_waiters: dict[str, deque[trio.Event]] = {}

    @property
    def limit(self) -> int:
        return int(self._limiter.total_tokens)

    def __contains__(self, key: object) -> bool:
        """True while ``key`` is queued or running."""
        return key in self._in_channel or key in self._queue

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Dispatch ready items until cancelled. Start it with ``nursery.start``.

        Work tasks live in this coroutine's own nursery, so cancelling ``run``
        cancels every running ``work`` call (and waits for each to finish its own
        shielded cleanup) and starts nothing new; items still queued (in the
        channel or the lanes) stay queued, for :meth:`drain` to hand back. It never
        returns otherwise.
        """
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._take_submissions, name="scheduler intake")
            task_status.started()
            while True:
                self._wake = trio.Event()
                self._dispatch(nursery)
                await self._wake.wait()

    async def _take_submissions(self) -> None:
        # The send side is never closed, so this only ends by cancellation.
        receive_nowait = self._receive.receive_nowait
        in_channel = self._in_channel
        push_entry = self._queue.push_entry
        async for entry in self._receive:
            # Everything already waiting goes in one pass, then one dispatch.
            while True:
                if not entry.removed:  # else withdrawn on the way
                    del in_channel[entry.key]
                    if entry.slotless:
                        self._channel_slotless -= 1
                    # Channel order is submit order, so LaneQueue's accept order is too.
                    push_entry(entry)
                try:
                    entry = receive_nowait()
                except trio.WouldBlock:
                    break
            self._wake.set()

    def _dispatch(self, nursery: trio.Nursery) -> None:
        # No draining check needed: drain() takes every run out of the queue and
        # submit() refuses while draining, so only settled items are left to start.
        limiter = self._limiter
        pop_ready = self._queue.pop_ready
        # Counted once per pass: every token taken below is taken by this loop, and
        # nothing else runs until it returns.
        tokens = int(limiter.available_tokens)
        while True:
            entry = pop_ready(tokens > 0)
            if entry is None:
                return
            key = entry.key
            slot = Slot(None, key)
            if not entry.slotless:
                limiter.acquire_on_behalf_of_nowait(key)
                tokens -= 1
                slot = Slot(self, key)
            nursery.start_soon(self._execute, key, entry.lane, entry.item, slot,
                               name=f"scheduler work {key}")

    async def _execute(self, key: str, lane: str, item: T, slot: Slot) -> None:
        try:
            await self._work(key, item, slot)
        except Exception:
            # The work reports its own failures (the runner turns any exception
            # into a reported outcome); this is the last line, so a bug there
            # cannot take the scheduler (and every other run) down with it, or
            # leave its lane or slot taken forever. Logged with the traceback.
            _log.exception("work for %s on lane %s raised; its lane and slot are freed",
                           key, lane)
        finally:
            slot.release()
            self._queue.release(lane)
            if self._hold_waiters and lane in self._hold_waiters:
                self._queue.hold(lane)  # free this instant, so this cannot fail
                self._hand_over(lane)
            self._wake.set()

    def _slot_freed(self, key: str) -> None:
        # :meth:`Slot.release`, once per slot: another lane may start now.
        self._limiter.release_on_behalf_of(key)
        self._wake.set()

    def submit(self, key: str, lane: str, item: T) -> None:
        """Queue ``item`` on ``lane``; it starts once a slot and its lane are free.

        Never blocks. Raises ``ValueError`` for a key already queued or running,
        :class:`DrainingError` after :meth:`drain`, and :class:`QueueFullError`
        when ``queue_cap`` items are already on their way in.
        """
        if self._draining:
            raise DrainingError(f"the scheduler is draining; {key!r} was not queued")
        if key in self._in_channel or key in self._queue:
            raise ValueError(f"{key!r} is already queued or running")
        entry = Entry(0, key, lane, item)
        try:
            self._send.send_nowait(entry)
        except trio.WouldBlock:
            raise QueueFullError(
                f"{key!r} was not queued: {len(self._in_channel)} runs are already "
                "waiting; the server should deliver it again later"
            ) from None
        self._in_channel[key] = entry

    def settle(self, key: str, lane: str, item: T) -> bool:
        """``item`` only needs reporting: it starts once ``lane`` is free, without a
        slot, and holds the lane until its ``work`` returns (its report settled), so
        the lane's later turns neither start nor report before it (§4).

        A ``key`` still queued (a run cancelled before it started) is turned into
        ``item`` in its place and keeps its turn; any other is put in line for its
        lane now. Never refused (a drain, the queue cap): a run that only needs
        reporting is never lost. Never blocks. False (nothing changes) for a ``key``
        that is running: its own ``work`` reports it.
        """
        entry = self._in_channel.get(key)
        if entry is not None:
            entry.item = item
            if not entry.slotless:
                entry.slotless = True
                self._channel_slotless += 1
            return True
        if self._queue.make_slotless(key, item):
            self._wake.set()
            return True
        if key in self._queue:
            return False
        self._queue.push_entry(Entry(0, key, lane, item, slotless=True))
        self._wake.set()
        return True

    def starts_at_once(self, lane: str) -> bool:
        """Whether an item submitted on ``lane`` now would start at the next dispatch:
        its lane is free (nothing runs, waits or is in line to hold it) and a slot is
        left for it after every item already waiting took one. So at most ``limit``
        items submitted while this held can be waiting at any moment (a hold
        arriving meanwhile may still keep one waiting)."""
        in_channel = self._in_channel
        queue = self._queue
        # Runs waiting take the free slots first; settled items take none.
        waiting = (len(in_channel) - self._channel_slotless
                   + queue.queued - queue.queued_slotless)
        if waiting >= self._limiter.available_tokens:
            return False
        if not queue.is_free(lane) or lane in self._hold_waiters:
            return False
        # Fewer than `limit` runs, by the test above (and the few runs cancelled
        # on their way in).
        return all(entry.lane != lane for entry in in_channel.values())

    def remove(self, key: str) -> T | None:
        """Take a queued item out (a cancelled run). ``None`` if it isn't queued:
        a running item is stopped by its own cancel scope, not here."""
        entry = self._in_channel.pop(key, None)
        if entry is not None:
            entry.removed = True
            if entry.slotless:
                self._channel_slotless -= 1
            item: T | None = entry.item
        else:
            item = self._queue.remove(key)
        return item

    def drain(self) -> list[tuple[str, T]]:
        """Stop starting new work and hand back every queued run, in accept order.

        Running items go on to finish, and settled ones (:meth:`settle`) to be
        reported; later ``submit`` calls raise :class:`DrainingError`.
        """
        self._draining = True
        # Everything in the lanes was submitted before anything still in the channel.
        items = self._queue.drain()
        for key, entry in list(self._in_channel.items()):
            if not entry.slotless:
                entry.removed = True
                items.append((entry.key, entry.item))
                del self._in_channel[key]
        return items

    @contextlib.asynccontextmanager
    async def holding(self, lane: str) -> AsyncIterator[None]:
        """Keep ``lane`` to the caller for the block: waits until nothing runs on it
        (and nobody else holds it), then starts none of its runs until the block
        ends. Its queued runs stay queued and start afterwards, in order; other
        lanes are unaffected. A waiting holder gets the lane the moment its run
        ends, before the lane's next queued run (first come, first served among
        holders). For work on a lane's files that must not race a turn
        (collecting its worktrees).

        Cancelled while waiting: nothing is held. On leaving the block, by any
        route, the lane is let go.
        """
        granted = trio.Event()
        if self._queue.hold(lane):
            granted.set()
        else:
            self._hold_waiters.setdefault(lane, deque()).append(granted)
        try:
            await granted.wait()
        except BaseException:
            if granted.is_set():  # handed over as the wait was cancelled
                self._let_go(lane)
            else:
                waiters = self._hold_waiters[lane]
                waiters.remove(granted)
                if not waiters:
                    del self._hold_waiters[lane]
            raise
        try:
            yield
        finally:
            self._let_go(lane)

    def _let_go(self, lane: str) -> None:
        # The caller holds ``lane``: the next holding() waiting for it gets it as
        # it is, else its runs may start again.
        if lane in self._hold_waiters:
            self._hand_over(lane)
            return
        self._queue.unhold(lane)
        self._wake.set()

    def _hand_over(self, lane: str) -> None:
        # ``lane`` is held: pass the hold to the first holding() waiting for it.
        waiters = self._hold_waiters[lane]
        granted = waiters.popleft()
        if not waiters:
            del self._hold_waiters[lane]
        granted.set()

    def statistics(self) -> SchedulerStatistics:
        """A frozen snapshot: the limiter's figures, lanes reporting, queued, draining."""
        limiter = self._limiter.statistics()
        waiting_reports = self._queue.queued_slotless + self._channel_slotless
        return SchedulerStatistics(
            limit=int(limiter.total_tokens),
            running=limiter.borrowed_tokens,
            queued=self._queue.queued + len(self._in_channel) - waiting_reports,
            draining=self._draining,
            reporting=self._queue.running - limiter.borrowed_tokens + waiting_reports,
            held_lanes=self._queue.held,
            waiting_reports=waiting_reports,
        )
