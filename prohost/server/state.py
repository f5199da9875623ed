"""The reference server's in-memory model: pairings, runs, connections and knobs.

Everything here is synchronous and runs on the server's one trio thread, so no
lock is needed: the ASGI app (:mod:`prohost.server.app`) decodes a frame or an
HTTP request and calls one method here, which changes the records and queues any
answer on the connection's outbox. Timers use trio's clock
(:func:`trio.current_time`), so tests can run the server under ``autojump_clock``.

The records are kept whole for the server's life, because tests assert on them:
every message a harness sent, every ack of every run, every completion POST.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import secrets
import string
import time
from typing import Any, NamedTuple

import attrs
import trio

from prohost.protocol import (
    Ack,
    Cancel,
    Delivery,
    Heartbeat,
    HeartbeatAck,
    Hello,
    Message,
    Ping,
    Status,
    encode,
)
from prohost.signature import sign

log = logging.getLogger("prohost.server")

WS_PATH = "/v1/agent/ws"
FEATURES = ("cancel", "timeline")

#: A run's life on the server. ``queued``: waiting to be (re)sent; ``delivered``: sent,
#: not acked yet; ``accepted``: a harness acked 200 and holds it.
RUN_STATES = ("queued", "delivered", "accepted", "completed", "failed", "cancelled", "closed")
TERMINAL_STATES = frozenset({"completed", "failed", "cancelled", "closed"})
#: States in which a run is still offered to harnesses.
UNACKED_STATES = frozenset({"queued", "delivered"})

#: Frames waiting for one connection's writer; a harness that lets more pile up
#: than this is not reading, and its connection is dropped.
OUTBOX_SIZE = 1024


def generate_pairing_code() -> str:
    """A fresh code in the ``ABCD-1234`` format."""
    letters = "".join(secrets.choice(string.ascii_uppercase) for _ in range(4))
    digits = "".join(secrets.choice(string.digits) for _ in range(4))
    return f"{letters}-{digits}"


@attrs.define
class Harness:
    """One pairing: the credentials a harness got from ``POST /v1/agent/pair``."""

    token: str
    secret: str
    machine: str
    paired_at: float


@attrs.define
class AckRecord:
    delivery_id: str
    connection_id: int
    status: int
    reason: str
    at: float  # trio.current_time()


class Received(NamedTuple):
    """One message a harness sent, in arrival order (``at`` is trio time)."""

    connection_id: int
    message: Message
    at: float


class Sent(NamedTuple):
    """One frame the server wrote to a harness (``at`` is trio time)."""

    connection_id: int
    text: str
    at: float


class Malformed(NamedTuple):
    """A frame from a harness that did not decode, and why."""

    connection_id: int
    text: str
    error: str
    at: float


class ConnectionEvent(NamedTuple):
    """``connect`` or ``disconnect`` of one connection; ``connected`` counts after it."""

    kind: str
    connection_id: int
    machine: str | None
    connected: int
    at: float


@attrs.define(eq=False)
class RunRecord:
    run_id: str
    conversation_id: str | None
    body: dict[str, Any]
    #: The exact JSON text that is signed and sent as the delivery's ``body``.
    body_text: str
    created_at: float
    state: str = "queued"
    #: Token of the harness the run was last sent to (after a 200 ack: that holds it).
    harness: str | None = None
    connection_id: int | None = None
    #: Token of the harness that acked it 200, if any.
    accepted_by: str | None = None
    delivery_ids: list[str] = attrs.field(factory=list)
    acks: list[AckRecord] = attrs.field(factory=list)
    #: trio time at which the run is (re)sent; None once no more sends are due.
    due_at: float | None = 0.0
    cancel_requested: bool = False
    cancel_reason: str | None = None
    completion: dict[str, Any] | None = None
    completion_posts: int = 0
    idempotency_keys: list[str | None] = attrs.field(factory=list)
    timeline: list[Any] = attrs.field(factory=list)
    error: str | None = None
    #: The latest entry for this run in a harness heartbeat.
    last_beat: dict[str, Any] | None = None

    @property
    def delivery_count(self) -> int:
        return len(self.delivery_ids)

    @property
    def ack_statuses(self) -> list[int]:
        return [ack.status for ack in self.acks]

    @property
    def reply(self) -> str | None:
        if self.completion is None:
            return None
        reply = self.completion.get("reply")
        return reply if isinstance(reply, str) else None

    @property
    def cancel_pending(self) -> bool:
        """Cancelled while a harness may hold it, and no completion yet."""
        return self.cancel_requested and self.completion is None and self.state != "closed"


@attrs.define(eq=False)
class Connection:
    """One accepted harness WebSocket."""

    id: int
    token: str
    machine: str | None
    agent: str | None
    client: tuple[str, int] | None
    server: tuple[str, int] | None
    connected_at: float
    outbox: trio.MemorySendChannel[str]
    cancel_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    #: The latest ``status`` message.
    status: Status | None = None
    #: Said so in ``status``, or answered a delivery 503: gets no new work while
    #: another harness can take it.
    draining: bool = False
    #: When set, the connection is closed with this WebSocket code (else it just ends).
    close_code: int | None = None
    pings_sent: int = 0

    def send(self, text: str) -> bool:
        """Queue one frame; a harness that stopped reading is dropped."""
        try:
            self.outbox.send_nowait(text)
        except trio.WouldBlock:
            log.warning("connection %d is not reading; dropping it", self.id)
            self.cancel_scope.cancel()
            return False
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        return True

    def close(self, code: int) -> None:
        self.close_code = code
        self.cancel_scope.cancel()


@attrs.define(eq=False)
class ServerState:
    pairing_code: str
    # ---- knobs tests flip at run time
    heartbeat_s: float = 15.0
    redeliver_after_s: float = 10.0
    #: Send nothing at all (no hello, pings, acks, deliveries) while still reading.
    silent: bool = False
    #: Reject WebSocket upgrades with this HTTP status.
    handshake_status: int | None = None
    #: Answered to the next completion POSTs, in order, before normal handling.
    completion_faults: list[tuple[int, dict[str, str]]] = attrs.field(factory=list)
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
    #: conversation_id → token of the harness that holds the conversation.
    conversation_owner: dict[str, str] = attrs.field(factory=dict)
    #: delivery id → run_id, for every delivery ever sent.
    deliveries: dict[str, str] = attrs.field(factory=dict)
    #: Runs still offered to harnesses (queued or delivered and unacked), by run_id.
    _offered: dict[str, RunRecord] = attrs.field(factory=dict)
    _next_connection_id: int = 1
    _changed: trio.Event = attrs.field(factory=trio.Event)

    # ------------------------------------------------------------------ change notification

    def changed(self) -> None:
        """Wake everyone waiting for a change (tests' ``wait_until``, the dispatcher)."""
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self) -> None:
        await self._changed.wait()

    @property
    def connected(self) -> int:
        return len(self.connections)

    # ------------------------------------------------------------------ pairing

    def code_matches(self, code: str) -> bool:
        given = code.strip().upper().encode()
        return hmac.compare_digest(given, self.pairing_code.upper().encode())

    def pair(self, machine: str) -> Harness:
        harness = Harness(
            token="pht_" + secrets.token_urlsafe(24),
            secret=secrets.token_hex(32),
            machine=machine,
            paired_at=time.time(),
        )
        self.harnesses[harness.token] = harness
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
        self._offered[run_id] = run
        log.info("run %s queued (conversation %s)", run_id, conversation_id)
        self.changed()
        return run

    def cancel_run(self, run: RunRecord, reason: str | None) -> None:
        """Stop ``run``: never deliver it again, and tell a harness that holds it."""
        if run.state in TERMINAL_STATES or run.cancel_requested:
            return
        run.cancel_requested = True
        run.cancel_reason = reason
        if run.state in UNACKED_STATES:
            run.state = "cancelled"
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
        run.state = "closed"
        self._withdraw(run)
        self.changed()

    def record_completion(self, run: RunRecord, payload: dict[str, Any]) -> None:
        run.completion = payload
        self._withdraw(run)
        if run.state != "cancelled":
            run.state = "completed" if payload.get("ok") is True else "failed"
        if payload.get("ok") is not True:
            error = payload.get("error")
            run.error = error if isinstance(error, str) else "the run failed"
        log.info("run %s %s", run.run_id, run.state)
        self.changed()

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
        now = trio.current_time()
        conn = Connection(
            id=self._next_connection_id,
            token=token,
            machine=machine,
            agent=agent,
            client=client,
            server=server,
            connected_at=now,
            outbox=outbox,
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
        for run in self._offered.values():
            if run.state == "delivered" and run.harness == token:
                run.due_at = now
        self.connection_events.append(
            ConnectionEvent("connect", conn.id, machine, self.connected, now)
        )
        log.info("harness %s connected (connection %d)", machine or "?", conn.id)
        self.changed()
        return conn, inbox

    def remove_connection(self, conn: Connection) -> None:
        if self.connections.pop(conn.id, None) is None:
            return
        self.connection_events.append(
            ConnectionEvent(
                "disconnect", conn.id, conn.machine, self.connected, trio.current_time()
            )
        )
        log.info("harness %s disconnected (connection %d)", conn.machine or "?", conn.id)
        self.changed()

    def close_connections(self, code: int) -> None:
        for conn in self.connections.values():
            conn.close(code)

    def record_sent(self, conn: Connection, text: str) -> None:
        self.sent.append(Sent(conn.id, text, trio.current_time()))

    def record_malformed(self, conn: Connection, text: str, error: str) -> None:
        log.warning("connection %d sent a malformed frame: %s", conn.id, error)
        self.malformed.append(Malformed(conn.id, text, error, trio.current_time()))
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
        self.received.append(Received(conn.id, message, trio.current_time()))
        if isinstance(message, Ack):
            self._on_ack(conn, message)
        elif isinstance(message, Heartbeat):
            self._on_heartbeat(conn, message)
        elif isinstance(message, Status):
            conn.status = message
            conn.draining = message.draining
        self.changed()

    def _on_ack(self, conn: Connection, ack: Ack) -> None:
        run_id = self.deliveries.get(ack.id)
        run = self.runs.get(run_id) if run_id else None
        if run is None:
            log.info("connection %d acked an unknown delivery %s", conn.id, ack.id)
            return
        run.acks.append(AckRecord(ack.id, conn.id, ack.status, ack.reason, trio.current_time()))
        open_ = run.state in UNACKED_STATES
        if ack.status == 200:
            if open_:
                run.state = "accepted"
                run.harness = run.accepted_by = conn.token
                self._withdraw(run)
            elif run.state == "cancelled" and run.cancel_pending:
                # Cancelled while this delivery was in flight: the harness holds it now.
                run.accepted_by = conn.token
                self._send_cancel(run, conn.token)
        elif ack.status in (400, 401, 413):
            if open_:
                run.state = "failed"
                run.error = f"the harness rejected the delivery ({ack.status}): {ack.reason}"
                self._withdraw(run)
        elif ack.status == 503:
            conn.draining = True
            if open_:
                run.state = "queued"
                run.due_at = trio.current_time() + self.redeliver_after_s
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
        cancel = [
            run.run_id
            for run in self.runs.values()
            if run.cancel_pending and (run.accepted_by == conn.token or run.run_id in listed)
        ]
        conn.send(encode(HeartbeatAck(seq=beat.seq, cancel=cancel, unknown=unknown)))

    # ------------------------------------------------------------------ deliveries

    def ping(self, conn: Connection) -> None:
        conn.pings_sent += 1
        conn.send(encode(Ping(id=f"p-{conn.pings_sent}")))

    def dispatch(self, now: float) -> float:
        """Send every run that is due to a harness that can take it.

        Returns when the next send falls due (``inf`` when nothing is scheduled);
        a due run that no harness can take waits for the next change of state.
        """
        next_due = math.inf
        busy: dict[str, int] | None = None
        for run in list(self._offered.values()):
            assert run.due_at is not None
            if run.due_at > now:
                next_due = min(next_due, run.due_at)
                continue
            if busy is None:
                busy = self._busy()
            conn = self._pick_connection(run, busy)
            previous = run.harness if run.state == "delivered" else None
            if conn is None or not self._deliver(run, conn, now):
                continue
            if previous:
                busy[previous] -= 1
            busy[conn.token] = busy.get(conn.token, 0) + 1
            next_due = min(next_due, run.due_at)
        return next_due

    def _busy(self) -> dict[str, int]:
        """How many runs each harness (by token) has been sent or holds."""
        busy: dict[str, int] = {}
        for run in self.runs.values():
            if run.harness and run.state in ("delivered", "accepted"):
                busy[run.harness] = busy.get(run.harness, 0) + 1
        return busy

    def _withdraw(self, run: RunRecord) -> None:
        """Stop offering ``run`` to harnesses."""
        run.due_at = None
        self._offered.pop(run.run_id, None)

    def _pick_connection(self, run: RunRecord, busy: dict[str, int]) -> Connection | None:
        """Where a run goes: back to the harness it was last sent to (while unacked);
        else the harness that holds its conversation; else the least busy one.
        Draining harnesses get work only when no other harness is connected."""
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
        return min(ready, key=lambda c: (busy.get(c.token, 0), c.id))

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
        self.deliveries[delivery.id] = run.run_id
        run.delivery_ids.append(delivery.id)
        run.state = "delivered"
        run.harness = conn.token
        run.connection_id = conn.id
        run.due_at = now + self.redeliver_after_s
        if run.conversation_id:
            self.conversation_owner[run.conversation_id] = conn.token
        log.info(
            "run %s sent to %s (delivery %d)", run.run_id, conn.machine or "?", run.delivery_count
        )
        self.changed()
        return True

    # ------------------------------------------------------------------ views

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
        }
        return view
