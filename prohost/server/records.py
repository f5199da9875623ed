"""The reference server's records: what it keeps about pairings, runs, acks,
completion POSTs and connections. Plain data; :mod:`prohost.server.state` changes it."""

from __future__ import annotations

import logging
import secrets
import string
from typing import Any, NamedTuple

import attrs
import trio

from prohost.wire.protocol import Message, Status

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
#: than this is not reading, and its connection is dropped. Well above
#: :data:`DELIVERY_WINDOW`, so a harness that reads but acks slowly is never dropped
#: for it: deliveries beyond the window wait on the server, not in the outbox.
OUTBOX_SIZE = 1024

#: Deliveries one connection may have sent and not yet acked (count). The rest wait
#: on the server and go out as acks come back, so 10,000 waiting runs cannot
#: overflow the outbox (which would drop a harness that is reading fine).
DELIVERY_WINDOW = 256


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


class CompletionPost(NamedTuple):
    """One POST to a run's completion path, whatever the server answered.

    ``payload`` is the decoded JSON body (None when it was not JSON); ``status`` is
    what the server answered; ``forgotten`` marks a POST the ``forget`` fault
    answered 200 and then dropped. ``at`` is the server's clock.
    """

    status: int
    payload: Any
    idempotency_key: str | None
    forgotten: bool
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
    #: Every completion POST for this run, in arrival order (see :class:`CompletionPost`).
    posts: list[CompletionPost] = attrs.field(factory=list)
    #: 503 acks since the last other answer; each doubles the wait before a resend.
    busy_acks: int = 0
    idempotency_keys: list[str | None] = attrs.field(factory=list)
    timeline: list[Any] = attrs.field(factory=list)
    error: str | None = None
    #: The latest entry for this run in a harness heartbeat.
    last_beat: dict[str, Any] | None = None
    #: 1 for a run as submitted; n + 1 for the run that retries attempt n.
    attempt: int = 1
    #: The run this one retries (its retryable failure), and the run that retries this.
    retry_of: str | None = None
    retried_as: str | None = None

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
    #: The harness closed the socket itself, normally (code 1000): it went on
    #: purpose (``agent stop``, Ctrl-C), so it is not expected back.
    closed_by_harness: bool = False
    pings_sent: int = 0
    #: When the next ping is due (server clock).
    next_ping_at: float = 0.0
    #: run_ids sent on this connection and not acked yet (at most DELIVERY_WINDOW).
    in_flight: set[str] = attrs.field(factory=set)
    #: The most deliveries this connection ever had in flight at once.
    max_in_flight: int = 0

    def send(self, text: str) -> bool:
        """Queue one frame; a harness that stopped reading is dropped."""
        try:
            self.outbox.send_nowait(text)
        except trio.WouldBlock:
            log.warning("connection %d is not reading; dropping it", self.id)
            self.cancel_scope.cancel()
            return False
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            # Its writer is gone: the connection is over, even if it is not removed
            # yet. Ended here, so dispatch stops seeing room on it (else it would
            # offer the same runs to it forever; the soak found that hang).
            self.cancel_scope.cancel()
            return False
        return True

    def close(self, code: int) -> None:
        self.close_code = code
        self.cancel_scope.cancel()
