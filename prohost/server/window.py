"""Which run goes out next, and to whom: the reference server's delivery queues,
timers, and the sending half of its model (:class:`Deliveries`).

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

import collections
import heapq
import itertools
import logging
import math
import secrets
import time
from collections import deque
from collections.abc import Iterable

from prohost.server.records import Connection, Harness, RunRecord
from prohost.wire.protocol import Delivery, Ping, encode
from prohost.wire.signature import sign

log = logging.getLogger("prohost.server")

#: States in which a run counts against its harness's load.
_HELD_STATES = frozenset({"delivered", "accepted"})


class DeliveryQueue:
    """The waiting FIFO, the per-harness parking lots and the timer heap."""

    def __init__(self) -> None:
        self._waiting: deque[str] = deque()
        self._queued: set[str] = set()
        self._parked: dict[str, deque[str]] = {}
        self._timers: list[tuple[float, int, str]] = []
        self._order = itertools.count()

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


class Deliveries:
    """How :class:`~prohost.server.state.ServerState` sends: pings, the window of
    each connection, who gets which run. A mixin, so the model stays one object
    while this job reads on its own; the attributes are the model's."""

    heartbeat_s: float
    redeliver_after_s: float
    window: int
    runs: dict[str, RunRecord]
    harnesses: dict[str, Harness]
    connections: dict[int, Connection]
    counts: collections.Counter[str]
    conversation_owner: dict[str, str]
    deliveries: dict[str, str]
    _offered: dict[str, RunRecord]
    _load: dict[str, set[str]]
    _queue: DeliveryQueue

    def changed(self) -> None:
        raise NotImplementedError

    def _move(self, run: RunRecord, state: str, harness: str | None = None) -> None:
        """Put ``run`` in ``state`` (and, when given, with ``harness``), keeping the
        per-state counts and each harness's load."""
        if run.harness and run.state in _HELD_STATES:
            self._load.get(run.harness, set()).discard(run.run_id)
        self.counts[run.state] -= 1
        run.state = state
        if harness is not None:
            run.harness = harness
        self.counts[state] += 1
        if run.harness and state in _HELD_STATES:
            self._load.setdefault(run.harness, set()).add(run.run_id)

    def ping(self, conn: Connection) -> None:
        conn.pings_sent += 1
        conn.send(encode(Ping(id=f"p-{conn.pings_sent}")))

    def dispatch(self, now: float) -> float:
        """Ping who is due, then fill every connection's delivery window.

        Returns when something next falls due (``inf`` when nothing is scheduled);
        runs that no connection can take now wait for the next change of state (an
        ack, a connection). Each run taken from a queue costs O(1) or O(log n).
        """
        next_due = math.inf
        for conn in list(self.connections.values()):
            if now >= conn.next_ping_at:
                conn.next_ping_at = now + self.heartbeat_s
                self.ping(conn)
            next_due = min(next_due, conn.next_ping_at)
        for run_id, at in self._queue.due(now):
            run = self._offered.get(run_id)
            if run is None or run.due_at != at:
                continue  # withdrawn or rescheduled since this timer was set
            # An unacked resend goes at once: it holds a window slot already.
            if run.state != "delivered" or not self._offer(run_id, now):
                self._queue.push(run_id, front=run.state == "delivered")
        for token in self._queue.parked_tokens():
            # Bounded: a run may be parked again (for another connection of the
            # same harness, say), and must not be taken twice in one pass.
            for _ in range(self._queue.parked_count(token)):
                parked = self._queue.unpark(token) if self._newest_with_room(token) else None
                if parked is None:
                    break
                self._offer(parked, now)
        while self._any_room():
            waiting = self._queue.pop()
            if waiting is None:
                break
            if not self._offer(waiting, now):
                self._queue.push_back_first(waiting)
                break
        return min(next_due, self._queue.next_timer())

    def _offer(self, run_id: str, now: float) -> bool:
        """Send ``run_id`` if a connection can take it, or park it for the harness it
        must go to. False when there is no connection at all (the run stays first)."""
        run = self._offered.get(run_id)
        if run is None or run.due_at is None or run.due_at > now:
            return True  # withdrawn or rescheduled since it was queued: drop the entry
        conn = self._pick_connection(run)
        if conn is None:
            return False
        if run_id not in conn.in_flight and len(conn.in_flight) >= self.window:
            self._queue.park(conn.token, run_id)
            return True
        if not self._deliver(run, conn, now):
            self._queue.push(run_id)
        return True

    def _any_room(self) -> bool:
        return any(
            len(c.in_flight) < self.window and not c.cancel_scope.cancel_called
            for c in self.connections.values()
        )

    def _live_of(self, token: str | None) -> list[Connection]:
        return [
            c
            for c in self.connections.values()
            if c.token == token and not c.cancel_scope.cancel_called
        ]

    def _newest_with_room(self, token: str) -> Connection | None:
        mine = self._live_of(token)
        if mine and len(mine[-1].in_flight) < self.window:
            return mine[-1]
        return None

    def _withdraw(self, run: RunRecord) -> None:
        """Stop offering ``run`` to harnesses (its queue entries are skipped later)."""
        run.due_at = None
        self._offered.pop(run.run_id, None)
        self._leave_window(run)

    def _leave_window(self, run: RunRecord) -> None:
        if run.connection_id is not None and (conn := self.connections.get(run.connection_id)):
            conn.in_flight.discard(run.run_id)

    def _pick_connection(self, run: RunRecord) -> Connection | None:
        """Where a run goes: back to the harness it was last sent to (while unacked);
        else the harness that holds its conversation; else the least busy one with
        room. Draining harnesses get work only when no other harness is connected."""
        live = [c for c in self.connections.values() if not c.cancel_scope.cancel_called]
        ready = [c for c in live if not c.draining] or live
        if not ready:
            return None

        def newest_of(token: str | None) -> Connection | None:
            mine = [c for c in ready if c.token == token]
            return mine[-1] if mine else None

        if run.state == "delivered" and (conn := newest_of(run.harness)):
            return conn
        if run.conversation_id and (
            conn := newest_of(self.conversation_owner.get(run.conversation_id))
        ):
            return conn
        with_room = [c for c in ready if len(c.in_flight) < self.window] or ready
        return min(with_room, key=lambda c: (len(self._load.get(c.token, ())), c.id))

    def _deliver(self, run: RunRecord, conn: Connection, now: float) -> bool:
        harness = self.harnesses[conn.token]
        timestamp = int(time.time())
        delivery = Delivery(
            id="dlv_" + secrets.token_hex(8),
            event="agent.run",
            timestamp=timestamp,
            signature=sign(harness.secret, timestamp, run.body_text),
            body=run.body_text,
        )
        if not conn.send(encode(delivery)):
            return False
        self._leave_window(run)
        conn.in_flight.add(run.run_id)
        conn.max_in_flight = max(conn.max_in_flight, len(conn.in_flight))
        self.deliveries[delivery.id] = run.run_id
        run.delivery_ids.append(delivery.id)
        self._move(run, "delivered", conn.token)
        run.connection_id = conn.id
        run.due_at = now + self.redeliver_after_s
        self._queue.schedule(run.run_id, run.due_at)
        if run.conversation_id:
            self.conversation_owner[run.conversation_id] = conn.token
        log.debug(
            "run %s sent to %s (delivery %d)", run.run_id, conn.machine or "?", run.delivery_count
        )
        self.changed()
        return True
