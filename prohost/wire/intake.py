"""Classifying one delivery into its ack status (docs/protocol.md §3).

Pure: no I/O, no clock of its own, so every rule is testable on its own and the
reader can never be made to raise by what a server sends. The ledger's part of the
decision (200 for a run it holds, 204 for one already reported) comes after this,
and only after it the 503 this returns for a *new* run (:attr:`Verdict.refusal`):
a run the harness holds or has reported is never answered 503, whatever state the
harness is in (§3), since the server would send it elsewhere and it would run twice.
"""

from __future__ import annotations

import json

import attrs

from prohost.wire import signature
from prohost.wire.protocol import Delivery
from prohost.wire.runs import AgentRun, BodyError, parse_body

#: A delivery ``body`` over this many UTF-8 bytes is refused with 413.
MAX_BODY_BYTES = 1024 * 1024
#: While this many runs wait for a slot, a new run is refused with 503 (§3): a
#: runaway server cannot fill the machine's memory with queued runs. ``--max-queued``
#: may lower it; the same number sizes the scheduler's memory channel, so a run
#: acked 200 always fits.
MAX_QUEUED_RUNS = 10_000
#: The 503 reason for a new run while the queue is full (§3 names it).
QUEUE_FULL = "queue full"
#: An ack's reason is cut to this many characters: it is "a short string" (§3), and
#: a hostile body must not make the harness send megabytes back.
MAX_REASON_CHARS = 500

ACCEPTED = 200
IGNORED = 204
MALFORMED = 400
UNSIGNED = 401
TOO_LARGE = 413
DRAINING = 503
#: The 503 reason for a new run during a drain (§9).
SHUTTING_DOWN = "the agent is shutting down and takes no new work"


@attrs.frozen
class Verdict:
    """An ack to send now, or (``run`` set, ``status`` 200) a run to take to the ledger."""

    status: int
    reason: str
    run: AgentRun | None = None
    body: str = ""
    #: With ``run``: the 503 reason that applies if the ledger does not know the run
    #: (draining, every account limited); ``None``: a new run may be accepted.
    refusal: str | None = None
    #: Set when the delivery was let through by --allow-unverified; say so in the log.
    unverified: str | None = None


def classify(
    delivery: Delivery,
    *,
    secret: str,
    now: float,
    draining: bool,
    allow_unverified: bool,
    unavailable: str | None = None,
) -> Verdict:
    """The first fault that applies wins: 413, 401, then 400 (§3); a run past them
    is returned with the 503 it gets if it is new (:attr:`Verdict.refusal`).

    Never raises, whatever the delivery holds (see :func:`prohost.wire.runs.parse_body`
    for what a body may not hold). The ledger's 200/204 for a run it knows come
    next, and only then the refusal, or the 503 of a full queue: the harness's to
    apply (:mod:`prohost.engine.supervisor.admission`). ``unavailable`` is the 503 reason when
    no agent account can take work (docs/protocol.md §12).
    """
    body = delivery.body
    # "surrogatepass": a lone surrogate counts as the 3 bytes it would take; the
    # body is refused for it later (400), after the checks that outrank that.
    if isinstance(body, str) and len(body.encode("utf-8", "surrogatepass")) > MAX_BODY_BYTES:
        return Verdict(TOO_LARGE, "body is over 1 MiB")
    # A non-string body cannot have been signed as sent; check it as its JSON
    # text so that 401 still wins over 400, as the order above requires.
    signed = body if isinstance(body, str) else _as_json(body)
    if signed is None:
        problem: str | None = "signature does not match (body is not a string)"
    else:
        problem = signature.check(secret, delivery.timestamp, signed, delivery.signature, now)
    if problem is not None and not allow_unverified:
        return Verdict(UNSIGNED, problem)
    if not isinstance(body, str):
        return Verdict(MALFORMED, "delivery.body must be a string of JSON text")
    if delivery.event != "agent.run":
        return Verdict(IGNORED, f"event {shown(delivery.event)} is not handled by this agent")
    try:
        run = parse_body(body)
    except BodyError as exc:
        return Verdict(MALFORMED, _short(str(exc)))
    refusal = SHUTTING_DOWN if draining else None if unavailable is None else _short(unavailable)
    return Verdict(ACCEPTED, "accepted", run=run, body=body, unverified=problem,
                   refusal=refusal)


def _as_json(value: object) -> str | None:
    """``value`` as JSON text, or ``None`` when it cannot be written back as JSON."""
    try:
        return json.dumps(value)
    except (ValueError, TypeError, RecursionError):  # UnreadableNumber, deep nesting
        return None


def shown(value: object) -> str:
    """A short, printable rendering of a value from the wire, for a reason or a log
    line: a string is quoted with lone surrogates and control characters escaped."""
    if isinstance(value, str):
        # repr escapes lone surrogates and control characters.
        return repr(value[:60]) + ("…" if len(value) > 60 else "")
    if value is None or isinstance(value, bool | int | float):
        return repr(value)[:60]
    return f"of type {type(value).__name__}"


def clean_text(text: str) -> str:
    """Wire text to carry on (a cancel's reason into a run's report): valid UTF-8,
    a lone surrogate replaced by ``?``, and cut to :data:`MAX_REASON_CHARS`."""
    return _short(text.encode("utf-8", "replace").decode("utf-8"))


def _short(reason: str) -> str:
    if len(reason) <= MAX_REASON_CHARS:
        return reason
    return reason[: MAX_REASON_CHARS - 1] + "…"
