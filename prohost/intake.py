"""Classifying one delivery into its ack status (PROTOCOL.md §3).

Pure: no I/O, no clock of its own, so every rule is testable on its own and the
reader can never be made to raise by what a server sends. The ledger's part of the
decision (200 for a run it holds, 204 for one already reported) comes after this.
"""

from __future__ import annotations

import json

import attrs

from prohost import signature
from prohost.protocol import Delivery
from prohost.runs import AgentRun, BodyError, parse_body

#: A delivery ``body`` over this many UTF-8 bytes is refused with 413.
MAX_BODY_BYTES = 1024 * 1024

ACCEPTED = 200
IGNORED = 204
MALFORMED = 400
UNSIGNED = 401
TOO_LARGE = 413
DRAINING = 503


@attrs.frozen
class Verdict:
    """An ack to send now, or (``run`` set, ``status`` 200) a run to admit to the ledger."""

    status: int
    reason: str
    run: AgentRun | None = None
    body: str = ""
    #: Set when the delivery was let through by --allow-unverified; say so in the log.
    unverified: str | None = None


def classify(
    delivery: Delivery,
    *,
    secret: str,
    now: float,
    draining: bool,
    allow_unverified: bool,
) -> Verdict:
    """The first fault that applies wins: 413, 503, 401, then 400 (§3)."""
    body = delivery.body
    if isinstance(body, str) and len(body.encode("utf-8", "surrogatepass")) > MAX_BODY_BYTES:
        return Verdict(TOO_LARGE, "body is over 1 MiB")
    if draining:
        return Verdict(DRAINING, "the agent is shutting down and takes no new work")
    # A non-string body cannot have been signed as sent; check it as its JSON
    # text so that 401 still wins over 400, as the order above requires.
    signed = body if isinstance(body, str) else json.dumps(body)
    problem = signature.check(secret, delivery.timestamp, signed, delivery.signature, now)
    if problem is not None and not allow_unverified:
        return Verdict(UNSIGNED, problem)
    if not isinstance(body, str):
        return Verdict(MALFORMED, "delivery.body must be a string of JSON text")
    if delivery.event != "agent.run":
        return Verdict(IGNORED, f"event {delivery.event!r} is not handled by this agent")
    try:
        run = parse_body(body)
    except BodyError as exc:
        return Verdict(MALFORMED, str(exc))
    return Verdict(ACCEPTED, "accepted", run=run, body=body, unverified=problem)
