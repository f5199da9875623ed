"""The reference server's in-memory model: pairings, runs, connections and knobs.

Everything here is synchronous and runs on the server's one trio thread, so no
lock is needed: the ASGI app (:mod:`prohost.server.app`) decodes a frame or an
HTTP request and calls one method here, which changes the records and queues any
answer on the connection's outbox. Time comes from ``clock`` (trio's clock by
default), so a test can run the model on a clock it sets by hand.

Deliveries go out through a window per connection (:data:`DELIVERY_WINDOW`
unacked at most) from the queues in :mod:`prohost.server.window`; every step of
:meth:`ServerState.dispatch` costs O(1) or O(log n), whatever the number of runs.

The records are kept whole for the server's life, because tests assert on them:
every message a harness sent, every ack of every run, every completion POST.
"""

from __future__ import annotations

import collections
import hmac
import json
import logging
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from prohost.server.fault_hooks import FaultHooks
from prohost.server.pairings import save_pairings
from prohost.server.records import (
    DELIVERY_WINDOW,
    FEATURES,
    OUTBOX_SIZE,
    RUN_STATES,
    TERMINAL_STATES,
    UNACKED_STATES,
    WS_PATH,
    AckRecord,
    CompletionPost,
    Connection,
    ConnectionEvent,
    Harness,
    Malformed,
    Received,
    RunRecord,
    Sent,
    generate_pairing_code,
)
from prohost.server.seen import SAVE_EVERY_S, Seen, expected_back, save_seen
from prohost.server.window import Deliveries, DeliveryQueue
from prohost.wire.protocol import (
    Ack,
    Cancel,
    Heartbeat,
    HeartbeatAck,
    Hello,
    Message,
    Status,
    encode,
)

__all__ = [
    "DELIVERY_WINDOW", "OUTBOX_SIZE", "RUN_STATES", "TERMINAL_STATES", "UNACKED_STATES",
    "WS_PATH", "AckRecord", "CompletionPost", "Connection", "Harness", "RunRecord",
    "ServerState", "generate_pairing_code",
]

log = logging.getLogger("prohost.server")

#: The first resend after a 503 ack waits this long (seconds); each further 503 in
#: a row doubles it, up to ``redeliver_after_s``. A 503 means "not now" (draining,
#: or the harness's queue is full), so the run comes back soon, not never.
BUSY_RETRY_FIRST_S = 0.5

#: The wait before a retryable failure is submitted again doubles with each attempt,
#: up to this (seconds), like a harness's own backoff (§1, §7).
RETRY_CAP_S = 30.0

#: Body fields that belong to one run_id; a retry gets its own (:meth:`ServerState.add_run`).
_PER_RUN_FIELDS = frozenset({"run_id", "completion_path", "timeline_path", "created_at"})


@attrs.define(eq=False)
class ServerState(Deliveries):
    pairing_code: str
    # ---- knobs tests flip at run time
    heartbeat_s: float = 15.0
    redeliver_after_s: float = 10.0
    #: How many times a run that failed retryable (§7: not started in a drain, the
    #: harness restarted, an internal error) is submitted again as a new run; 0: never.
    retries: int = 0
    #: The wait before the first retry; each further one doubles it (to RETRY_CAP_S).
    retry_first_s: float = 1.0
    #: Unacked deliveries one connection may have at once.
    window: int = DELIVERY_WINDOW
    #: Send nothing at all (no hello, pings, acks, deliveries) while still reading.
    silent: bool = False
    #: Reject WebSocket upgrades with this HTTP status.
    handshake_status: int | None = None
    #: Answered to the next completion POSTs, in order, before normal handling.
    completion_faults: list[tuple[int, dict[str, str]]] = attrs.field(factory=list)
    #: The soak's fault hooks (their routes exist only when ``faults.enabled``).
    faults: FaultHooks = attrs.field(factory=FaultHooks)
    #: The server's clock (seconds); trio's unless a test gives its own.
    clock: Callable[[], float] = trio.current_time
    #: Where pairings are saved (:mod:`prohost.server.pairings`); None: memory only.
    state_dir: Path | None = None
    #: Pairing codes already traded for credentials (upper case), to say so.
    used_codes: set[str] = attrs.field(factory=set)
    #: What the people's API requires (:mod:`prohost.server.apitoken`).
    api_token: str = ""
    #: Where it is written for ``prohost send`` to read (None: memory only).
    api_token_file: Path | None = None
    #: Wall-clock time (seconds since the epoch), for what outlives the process.
    wall_clock: Callable[[], float] = time.time
    #: When each harness was last connected, by machine (:mod:`prohost.server.seen`).
    seen: dict[str, Seen] = attrs.field(factory=dict)
    started_at: float = attrs.field(factory=time.time)
    _seen_saved_at: float = 0.0
    # ---- where the server listens (set once bound)
    http_url: str = ""
    ws_url: str = ""
    account: str = "local"
    # ---- records
    harnesses: dict[str, Harness] = attrs.field(factory=dict)
    runs: dict[str, RunRecord] = attrs.field(factory=dict)
    connections: dict[int, Connection] = attrs.field(factory=dict)
    received: list[Received] = attrs.field(factory=list)
    sent: list[Sent] = attrs.field(factory=list)
    malformed: list[Malformed] = attrs.field(factory=list)
    connection_events: list[ConnectionEvent] = attrs.field(factory=list)
    total_connects: int = 0
    #: How many runs are in each state (kept as runs move, for cheap waits).
    counts: collections.Counter[str] = attrs.field(factory=collections.Counter)
    #: conversation_id → token of the harness that holds the conversation.
    conversation_owner: dict[str, str] = attrs.field(factory=dict)
    #: delivery id → run_id, for every delivery ever sent.
    deliveries: dict[str, str] = attrs.field(factory=dict)
    #: Runs still offered to harnesses (queued or delivered and unacked), by run_id.
    _offered: dict[str, RunRecord] = attrs.field(factory=dict)
    #: token → run_ids delivered to or held by that harness (its load).
    _load: dict[str, set[str]] = attrs.field(factory=dict)
    #: run_ids with a cancel the harness may still need to hear.
    _cancelling: set[str] = attrs.field(factory=set)
    _queue: DeliveryQueue = attrs.field(factory=DeliveryQueue)
    _next_connection_id: int = 1
    _changed: trio.Event = attrs.field(factory=trio.Event)

    # ------------------------------------------------------------------ change notification

    def changed(self) -> None:
        """Wake everyone waiting for a change (tests' ``wait_until``, the dispatcher)."""
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self) -> None:
        """Return at the next change. Cancelled: returns nothing, changes nothing."""
        await self._changed.wait()

    @property
    def connected(self) -> int:
        return len(self.connections)

    # ------------------------------------------------------------------ pairing

    def code_matches(self, code: str) -> bool:
        given = code.strip().upper().encode()
        return hmac.compare_digest(given, self.pairing_code.upper().encode())

    def pair_with_code(self, code: str, machine: str) -> Harness | None:
        """Pair ``machine`` if ``code`` is the current pairing code, which is then used
        up: a one-time code must not let a second machine (whoever read it over a
        shoulder) in. The next code is logged; None for a wrong or used code."""
        if not self.code_matches(code):
            return None
        harness = self.pair(machine)  # raises (code unspent) when it cannot be saved
        used, self.pairing_code = self.pairing_code, generate_pairing_code()
        self.used_codes.add(used.upper())
        log.info("pairing code %s is used up (by %s); the next pairing code is %s",
                 used, machine, self.pairing_code)
        return harness

    def code_was_used(self, code: str) -> bool:
        return code.strip().upper() in self.used_codes

    def pair(self, machine: str) -> Harness:
        """A new pairing, saved to the state folder (when there is one) before it is
        answered: credentials a harness holds must outlive a restart of the server.
        Raises OSError when it cannot be saved (then nothing is paired)."""
        harness = Harness(
            token="pht_" + secrets.token_urlsafe(24),
            secret=secrets.token_hex(32),
            machine=machine,
            paired_at=time.time(),
        )
        self.harnesses[harness.token] = harness
        if self.state_dir is not None:
            try:
                # Synchronous on the server's one thread: pairing is rare and the
                # file small; the answer must wait for it to be durable anyway.
                save_pairings(self.state_dir, self.harnesses)
            except OSError:
                del self.harnesses[harness.token]
                raise
        log.info("paired %s", machine)
        self.changed()
        return harness

    def credentials(
        self, harness: Harness, *, http_url: str = "", ws_url: str = ""
    ) -> dict[str, str]:
        return {
            "token": harness.token,
            "secret": harness.secret,
            "ws_url": ws_url or self.ws_url,
            "api_url": http_url or self.http_url,
            "account": self.account,
        }

    def harness_for(self, token: str | None) -> Harness | None:
        return self.harnesses.get(token) if token else None

    # ------------------------------------------------------------------ runs

    def add_run(
        self, text: str, conversation_id: str | None = None, extra: dict[str, Any] | None = None
    ) -> RunRecord:
        """A new run, queued for delivery. ``extra`` adds or overrides body fields
        (``run_id`` too, which must then be a new string)."""
        extra = dict(extra or {})
        run_id = extra.pop("run_id", None)
        if run_id is None:
            run_id = "run_" + secrets.token_hex(6)
            while run_id in self.runs:
                run_id = "run_" + secrets.token_hex(6)
        elif not isinstance(run_id, str) or not run_id:
            raise ValueError("run_id must be a non-empty string")
        elif run_id in self.runs:
            raise ValueError(f"run {run_id} already exists")
        created_at = time.time()
        body: dict[str, Any] = {
            "run_id": run_id,
            "conversation_id": conversation_id,
            "kind": "message",
            "completion_path": f"/v1/agent/runs/{run_id}/complete",
            "timeline_path": f"/v1/agent/runs/{run_id}/timeline",
            "text": text,
            "author": None,
            "context": [],
            "instructions": None,
            "created_at": created_at,
        }
        body.update(extra)
        run = RunRecord(
            run_id=run_id,
            conversation_id=conversation_id,
            body=body,
            body_text=json.dumps(body, ensure_ascii=False, separators=(",", ":")),
            created_at=created_at,
        )
        self.runs[run_id] = run
        self.counts[run.state] += 1
        self._offered[run_id] = run
        run.due_at = self.clock()
        self._queue.push(run_id)
        log.info("run %s queued (conversation %s)", run_id, conversation_id)
        self.changed()
        return run


    def cancel_run(self, run: RunRecord, reason: str | None) -> None:
        """Stop ``run``: never deliver it again, and tell a harness that holds it."""
        if run.state in TERMINAL_STATES or run.cancel_requested:
            return
        run.cancel_requested = True
        run.cancel_reason = reason
        self._cancelling.add(run.run_id)
        if run.state in UNACKED_STATES:
            self._move(run, "cancelled")
            self._withdraw(run)
        else:  # accepted: the harness holds it and reports it when stopped
            self._send_cancel(run, run.accepted_by)
        log.info("run %s cancelled (%s)", run.run_id, reason)
        self.changed()

    def _send_cancel(self, run: RunRecord, token: str | None) -> None:
        text = encode(Cancel(run_id=run.run_id, reason=run.cancel_reason))
        for conn in self.connections.values():
            if conn.token == token:
                conn.send(text)

    def close_run(self, run: RunRecord) -> None:
        """Forget ``run``: completions get 404 and heartbeats hear it is unknown."""
        self._move(run, "closed")
        self._withdraw(run)
        self.changed()

    def record_completion(self, run: RunRecord, payload: dict[str, Any]) -> None:
        run.completion = payload
        self._withdraw(run)
        if run.state != "cancelled":
            self._move(run, "completed" if payload.get("ok") is True else "failed")
        if payload.get("ok") is not True:
            error = payload.get("error")
            run.error = error if isinstance(error, str) else "the run failed"
        log.info("run %s %s", run.run_id, run.state)
        if run.state == "failed" and payload.get("retryable") is True:
            if run.cancel_requested:
                # §6: a cancelled request is never run again, whatever the harness
                # could say of it (an older harness reports a cancel it lost to a
                # kill -9 as "restarted", retryable).
                log.info("run %s was cancelled; its retryable failure is not retried",
                         run.run_id)
            else:
                self._retry(run)
        self.changed()

    def _retry(self, run: RunRecord) -> None:
        """Submit a retryable failure again, as a new run after a backoff, the way a
        real server would: a new run_id, because a harness never runs a run_id in its
        ledger twice (§7), so the same one would be answered 204 and lost."""
        if run.attempt > self.retries:
            if self.retries:
                log.warning("run %s failed retryable after %d attempts; not retried again",
                            run.run_id, run.attempt)
            return
        extra = {k: v for k, v in run.body.items() if k not in _PER_RUN_FIELDS}
        text = extra.pop("text", "")
        extra.pop("conversation_id", None)
        retry = self.add_run(text if isinstance(text, str) else "", run.conversation_id, extra)
        retry.attempt = run.attempt + 1
        retry.retry_of = run.run_id
        run.retried_as = retry.run_id
        delay = min(RETRY_CAP_S, self.retry_first_s * 2 ** (run.attempt - 1))
        # The entry add_run queued is skipped once due_at moves (window.py).
        retry.due_at = self.clock() + delay
        self._queue.schedule(retry.run_id, retry.due_at)
        log.info("run %s failed retryable (%s); retrying it as %s in %.1f s (attempt %d)",
                 run.run_id, run.error, retry.run_id, delay, retry.attempt)

    # ------------------------------------------------------------------ connections

    def add_connection(
        self,
        token: str,
        *,
        machine: str | None,
        agent: str | None,
        client: tuple[str, int] | None,
        server: tuple[str, int] | None,
    ) -> tuple[Connection, trio.MemoryReceiveChannel[str]]:
        """Register an accepted socket and queue its ``hello``; unacked deliveries
        meant for this harness become due at once."""
        outbox, inbox = trio.open_memory_channel[str](OUTBOX_SIZE)
        now = self.clock()
        conn = Connection(
            id=self._next_connection_id,
            token=token,
            machine=machine,
            agent=agent,
            client=client,
            server=server,
            connected_at=now,
            outbox=outbox,
            next_ping_at=now + self.heartbeat_s,
        )
        self._next_connection_id += 1
        self.connections[conn.id] = conn
        self.total_connects += 1
        conn.send(
            encode(
                Hello(
                    heartbeat_s=self.heartbeat_s, server_time=time.time(), features=list(FEATURES)
                )
            )
        )
        for run_id in list(self._load.get(token, ())):
            run = self.runs[run_id]
            if run.state == "delivered":
                run.due_at = now
                self._queue.push(run_id, front=True)
        self.connection_events.append(
            ConnectionEvent("connect", conn.id, machine, self.connected, now)
        )
        self._saw(conn, left=False, save=True)
        log.info("harness %s connected (connection %d)", machine or "?", conn.id)
        self.changed()
        return conn, inbox

    def remove_connection(self, conn: Connection) -> None:
        if self.connections.pop(conn.id, None) is None:
            return
        # Its unacked deliveries keep their resend timers: the same harness may be
        # back at once (and gets them then), or they go elsewhere when they fall due.
        conn.in_flight.clear()
        if not self._live_of(conn.token):
            self._queue.release(conn.token)
        self.connection_events.append(
            ConnectionEvent("disconnect", conn.id, conn.machine, self.connected, self.clock())
        )
        # A harness that said it drains, or closed its socket normally while the
        # server did not ask it to, went on purpose; any other is expected back.
        left = (conn.status is not None and conn.status.draining) or (
            conn.closed_by_harness and conn.close_code is None)
        self._saw(conn, left=left, save=True)
        log.info("harness %s disconnected (connection %d)", conn.machine or "?", conn.id)
        self.changed()

    def _saw(self, conn: Connection, *, left: bool, save: bool) -> None:
        """Note that ``conn``'s harness was connected just now (saved to the state
        folder when ``save``, or when the last save is old)."""
        harness = self.harnesses.get(conn.token)
        machine = harness.machine if harness is not None else conn.machine or "?"
        now = self.wall_clock()
        self.seen[machine] = Seen(machine, now, left)
        if self.state_dir is not None and (save or now - self._seen_saved_at >= SAVE_EVERY_S):
            self._seen_saved_at = now
            save_seen(self.state_dir, self.seen)

    def close_connections(self, code: int) -> None:
        for conn in self.connections.values():
            conn.close(code)

    def record_sent(self, conn: Connection, text: str) -> None:
        self.sent.append(Sent(conn.id, text, self.clock()))

    def record_malformed(self, conn: Connection, text: str, error: str) -> None:
        log.warning("connection %d sent a malformed frame: %s", conn.id, error)
        self.malformed.append(Malformed(conn.id, text, error, self.clock()))
        self.changed()

    def messages(
        self, kind: type[Any] | None = None, connection_id: int | None = None
    ) -> list[Any]:
        """The decoded messages received, optionally of one class / one connection."""
        return [
            r.message
            for r in self.received
            if (kind is None or isinstance(r.message, kind))
            and (connection_id is None or r.connection_id == connection_id)
        ]

    # ------------------------------------------------------------------ harness messages

    def on_message(self, conn: Connection, message: Message) -> None:
        """Record and act on one decoded message from a harness."""
        self.received.append(Received(conn.id, message, self.clock()))
        if isinstance(message, Ack):
            self._on_ack(conn, message)
        elif isinstance(message, Heartbeat):
            self._on_heartbeat(conn, message)
            self._saw(conn, left=False, save=False)
        elif isinstance(message, Status):
            conn.status = message
            conn.draining = message.draining
        self.changed()

    def _on_ack(self, conn: Connection, ack: Ack) -> None:
        run_id = self.deliveries.get(ack.id)
        run = self.runs.get(run_id) if run_id else None
        if run is None:
            # A hostile id (a lone surrogate) is shown by its repr, never as it stands.
            log.info("connection %d acked an unknown delivery %r", conn.id, ack.id)
            return
        now = self.clock()
        run.acks.append(AckRecord(ack.id, conn.id, ack.status, ack.reason, now))
        # Any answer frees the window slot: the harness has read the delivery.
        conn.in_flight.discard(run.run_id)
        self._leave_window(run)
        open_ = run.state in UNACKED_STATES
        if ack.status == 503:
            conn.draining = True
            if open_:
                run.busy_acks += 1
                delay = min(
                    self.redeliver_after_s, BUSY_RETRY_FIRST_S * 2 ** (run.busy_acks - 1)
                )
                self._move(run, "queued")
                run.due_at = now + delay
                self._queue.schedule(run.run_id, run.due_at)
            return
        run.busy_acks = 0
        if ack.status == 200:
            if open_:
                self._move(run, "accepted", conn.token)
                run.accepted_by = conn.token
                self._withdraw(run)
            elif run.state == "cancelled" and run.cancel_pending:
                # Cancelled while this delivery was in flight: the harness holds it now.
                run.accepted_by = conn.token
                self._send_cancel(run, conn.token)
        elif ack.status in (400, 401, 413):
            if open_:
                self._move(run, "failed")
                run.error = f"the harness rejected the delivery ({ack.status}): {ack.reason}"
                self._withdraw(run)
        else:  # 204, or a status this server does not know: either way, stop
            if ack.status != 204:
                log.warning("run %s: unexpected ack status %d", run.run_id, ack.status)
            if open_:
                self._withdraw(run)

    def _on_heartbeat(self, conn: Connection, beat: Heartbeat) -> None:
        listed = set()
        unknown = []
        for entry in beat.runs:
            run = self.runs.get(entry.run_id)
            if run is None or run.state == "closed":
                unknown.append(entry.run_id)
                continue
            listed.add(entry.run_id)
            run.last_beat = {
                "state": entry.state,
                "lane": entry.lane,
                "started_at": entry.started_at,
                "activity": entry.activity,
                "machine": conn.machine,
            }
        cancel = []
        for run_id in list(self._cancelling):
            run = self.runs[run_id]
            if not run.cancel_pending:
                self._cancelling.discard(run_id)
            elif run.accepted_by == conn.token or run_id in listed:
                cancel.append(run_id)
        conn.send(encode(HeartbeatAck(seq=beat.seq, cancel=cancel, unknown=unknown)))


    # ------------------------------------------------------------------ views

    def status_view(self) -> dict[str, Any]:
        """What ``GET /v1/status`` shows: who is connected now, and who was until
        recently and should be back (never a token)."""
        connected = {
            harness.machine for conn in self.connections.values()
            if (harness := self.harnesses.get(conn.token)) is not None
        }
        back = expected_back(self.seen, connected, self.wall_clock(), self.started_at)
        return {
            "connected": self.connected,
            "expected_back": [{"machine": machine, "seen_s_ago": round(ago, 1)}
                              for machine, ago in back],
            "paired": len(self.harnesses),
            "harnesses": [
                {"machine": conn.machine, "draining": conn.draining}
                for conn in self.connections.values()
            ],
            "runs": dict(self.counts),
        }

    def run_view(self, run: RunRecord) -> dict[str, Any]:
        """What ``GET /v1/runs/<id>`` shows (never a token)."""
        harness = self.harnesses.get(run.harness) if run.harness else None
        view: dict[str, Any] = {
            "run_id": run.run_id,
            "conversation_id": run.conversation_id,
            "state": run.state,
            "reply": run.reply,
            "error": run.error,
            "timeline": run.timeline,
            "text": run.body.get("text"),
            "created_at": run.created_at,
            "machine": harness.machine if harness else None,
            "deliveries": run.delivery_count,
            "acks": [{"status": a.status, "reason": a.reason} for a in run.acks],
            "cancel_requested": run.cancel_requested,
            "activity": run.last_beat.get("activity") if run.last_beat else None,
            "completion": run.completion,
            # What the run changed and used (§7), as its report said.
            "changes": run.completion.get("changes") if run.completion else None,
            "usage": run.completion.get("usage") if run.completion else None,
            # A retryable failure submitted again (§11): follow retried_as to its end.
            "attempt": run.attempt,
            "retry_of": run.retry_of,
            "retried_as": run.retried_as,
        }
        return view
