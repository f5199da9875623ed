"""Fault hooks for the soak (issue 10): off by default, reachable only with a flag.

``prohost server --faults`` (or ``ServerConfig(faults=True)``) turns on these
routes; without it each answers 404, like any route that does not exist:

- ``POST /v1/faults/drop``      abort every harness socket now (TCP reset, no close
  frame); answers ``{"dropped": n}``.
- ``POST /v1/faults/storm``     ``{"status": 503, "count": 5, "retry_after": 2}``:
  the next ``count`` completion POSTs are answered ``status`` (one of
  :data:`STORM_STATUSES`), with ``Retry-After`` when ``retry_after`` is given.
- ``POST /v1/faults/restart``   ``{"down_s": 2}``: close every harness socket and
  stop listening for ``down_s`` seconds, then listen again on the same port. All
  state (runs, pairings, acks) is kept. Answered before the listener stops.
- ``POST /v1/faults/forget``    ``{"count": 1}`` or ``{"run_id": "run_…"}``: answer
  the next (or that run's next) valid completion 200 and drop it, so the run is
  never settled (the soak's self-check).
- ``POST /v1/faults/redeliver`` ``{"run_id": "run_…"}``: send the run's delivery again,
  freshly signed, to the harness that holds it (else any connected one), whatever
  the run's state — as a server that lost track of an ack would; the ack is recorded
  against the run. Answers ``{"delivery_id", "state"}``, 409 when no harness is
  connected.
- ``POST /v1/faults/hold``      ``{"run_id": "run_…"}``: that run's completion POSTs
  get no answer until ``POST /v1/faults/release`` with the same body (a slow server,
  for tests of what waits on a report); ``held_posts`` counts the ones waiting.
- ``GET  /v1/faults/runs``      per run: state, acked, ack statuses, deliveries,
  and every completion POST with its status and body (see :func:`audit`).
- ``GET  /v1/faults``           the hooks' settings and counters.

In process, :class:`prohost.server.ServerHandle` has the same hooks as methods.
"""

from __future__ import annotations

import os
import secrets
import socket
import struct
import time
from typing import Any

from prohost.server.records import Connection
from prohost.server.state import ServerState
from prohost.wire.protocol import Delivery, encode
from prohost.wire.signature import sign

#: Statuses a storm may answer: the ones a harness must retry (docs/protocol.md §7).
STORM_STATUSES = (408, 429, 500, 502, 503, 504)
#: Longest listener restart accepted (seconds); the soak uses a few seconds.
MAX_DOWN_S = 300.0
#: Most completion POSTs one storm or one forget may cover (count).
MAX_COUNT = 100_000


class FaultError(ValueError):
    """A fault request that does not make sense; the message says what to send."""


class NoHarness(FaultError):
    """A fault that needs a connected harness, asked for while none is (409)."""


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
        raise FaultError(f"{name} must be a whole number from 1 to {MAX_COUNT}")
    return value


def _seconds(value: Any, name: str, most: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= most:
        raise FaultError(f"{name} must be a number of seconds from 0 to {most:g}")
    return float(value)


def storm(state: ServerState, status: Any, count: Any = 1, retry_after: Any = None) -> None:
    """Answer the next ``count`` completion POSTs with ``status`` (and Retry-After)."""
    if status not in STORM_STATUSES or isinstance(status, bool):
        allowed = ", ".join(map(str, STORM_STATUSES))
        raise FaultError(f"status must be one of {allowed} (statuses a harness retries)")
    count = _count(count, "count")
    headers = {}
    if retry_after is not None:
        headers["Retry-After"] = str(int(_seconds(retry_after, "retry_after", MAX_DOWN_S)))
    state.completion_faults.extend([(status, headers)] * count)
    state.faults.storms += 1
    state.changed()


def forget(state: ServerState, count: Any = None, run_id: Any = None) -> None:
    """Drop the next ``count`` valid completions, or ``run_id``'s next one."""
    if run_id is not None:
        if not isinstance(run_id, str) or run_id not in state.runs:
            raise FaultError(f"run_id must name a run this server knows (got {run_id!r})")
        state.faults.forget_runs.add(run_id)
    if count is not None or run_id is None:
        state.faults.forget_next += _count(1 if count is None else count, "count")
    state.changed()


def hold(state: ServerState, run_id: Any, held: bool) -> None:
    """Hold ``run_id``'s completion POSTs unanswered (``held``), or let them go."""
    if not isinstance(run_id, str) or run_id not in state.runs:
        raise FaultError(f"run_id must name a run this server knows (got {run_id!r})")
    if held:
        state.faults.hold_runs.add(run_id)
    else:
        state.faults.hold_runs.discard(run_id)
    state.changed()


async def wait_while_held(state: ServerState, run_id: str) -> None:
    """A completion POST for a held run waits here until the run is released.
    Cancelled (the client went away): the count of waiting POSTs is put back."""
    hooks = state.faults
    if run_id not in hooks.hold_runs:
        return
    hooks.held_posts[run_id] = hooks.held_posts.get(run_id, 0) + 1
    state.changed()
    try:
        while run_id in hooks.hold_runs:
            await state.wait_changed()
    finally:
        hooks.held_posts[run_id] -= 1
        state.changed()


def request_restart(state: ServerState, down_s: Any) -> None:
    """Ask the listener to close everything and listen again after ``down_s``."""
    state.faults.restart_down_s = _seconds(down_s, "down_s", MAX_DOWN_S)
    state.faults.restart_requested.set()


def drop_all(state: ServerState, code: int) -> set[int]:
    """Abort every harness socket (a reset, no close frame; ``code`` where the
    socket cannot be found); returns the ids of the connections dropped."""
    dropped = set()
    for conn in list(state.connections.values()):
        if not abort_socket(conn):
            conn.close(code)
        conn.cancel_scope.cancel()
        dropped.add(conn.id)
    state.faults.drops += 1
    state.changed()
    return dropped


def audit(state: ServerState) -> list[dict[str, Any]]:
    """Per run, what the soak checks: state, whether a harness acked it 200, every
    ack status, deliveries, and every completion POST with its status and body."""
    return [
        {
            "run_id": run.run_id,
            "conversation_id": run.conversation_id,
            "state": run.state,
            "acked": any(ack.status == 200 for ack in run.acks),
            "ack_statuses": run.ack_statuses,
            "deliveries": run.delivery_count,
            "completion": run.completion,
            "posts": [
                {
                    "status": post.status,
                    "body": post.payload,
                    "idempotency_key": post.idempotency_key,
                    "forgotten": post.forgotten,
                }
                for post in run.posts
            ],
        }
        for run in state.runs.values()
    ]


def _address(value: Any) -> tuple[str, int] | None:
    if isinstance(value, list | tuple) and len(value) >= 2:
        return (str(value[0]), int(value[1]))
    return None


def abort_socket(conn: Connection) -> bool:
    """Reset the TCP connection under ``conn`` without a WebSocket close frame.

    ASGI gives an app no handle on its socket, so this finds it among the
    process's open descriptors by its two addresses, sets ``SO_LINGER`` 0 (the
    final close sends RST) and shuts it down, which the peer sees as a dropped
    connection. Returns False where descriptors cannot be listed.
    """
    if conn.server is None or conn.client is None:
        return False
    try:
        names = os.listdir("/dev/fd")
    except OSError:
        return False
    for name in names:
        if not name.isdigit():
            continue
        try:
            dup = os.dup(int(name))
        except OSError:
            continue
        try:
            sock = socket.socket(fileno=dup)
        except OSError:
            os.close(dup)
            continue
        with sock:
            try:
                if sock.type != socket.SOCK_STREAM or sock.family not in (
                    socket.AF_INET,
                    socket.AF_INET6,
                ):
                    continue
                if (
                    _address(sock.getsockname()) != conn.server
                    or _address(sock.getpeername()) != conn.client
                ):
                    continue
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.shutdown(socket.SHUT_RDWR)
                return True
            except OSError:
                continue
    return False


def redeliver(state: ServerState, run_id: Any) -> dict[str, Any]:
    """Send ``run_id``'s delivery once more, whatever its state (see the module
    docstring); ``{"delivery_id", "state"}``."""
    run = state.runs.get(run_id) if isinstance(run_id, str) else None
    if run is None:
        raise FaultError(f"run_id must name a run this server knows (got {run_id!r})")
    live = [c for c in state.connections.values() if not c.cancel_scope.cancel_called]
    conns = [c for c in live if c.token == run.harness] or live
    if not conns:
        raise NoHarness("no harness is connected; try again once one is")
    conn = conns[-1]
    timestamp = int(time.time())
    delivery = Delivery(
        id="dlv_fault_" + secrets.token_hex(8),
        event="agent.run",
        timestamp=timestamp,
        signature=sign(state.harnesses[conn.token].secret, timestamp, run.body_text),
        body=run.body_text,
    )
    if not conn.send(encode(delivery)):
        raise NoHarness("the harness's connection is closing; try again")
    # So that the ack is recorded against the run, like any other.
    state.deliveries[delivery.id] = run.run_id
    run.delivery_ids.append(delivery.id)
    state.changed()
    return {"delivery_id": delivery.id, "state": run.state}
