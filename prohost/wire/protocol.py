"""Every WebSocket message of docs/protocol.md §2, and the one converter that reads them.

Both sides use this module: the harness decodes what the server sends, and the
reference server decodes what the harness sends. Decoding is strict about types
(a number is never silently turned into a string) and lenient about the rest:
unknown fields are ignored and an unknown ``type`` decodes to :class:`Unknown`, so a
newer server can add messages without breaking an older harness.

The ``delivery`` message is deliberately loose: only its ``id`` must be a string,
because a delivery that has an id can always be acked, and the ack's status (400,
401, 413…) is decided later by :mod:`prohost.wire.intake`, which wants to see the raw
values to say precisely what was wrong.

Nothing a server sends can make :func:`decode` raise anything but
:class:`DecodeError`: nesting too deep for the parser, numbers too long for an
``int`` (Python refuses over 4,300 digits), ``NaN`` and ``Infinity`` all end up
either as a :class:`DecodeError` or as an :class:`UnreadableNumber` in place of
the number, which no typed field accepts. And :func:`encode` always returns text
that is valid UTF-8: a string holding a lone surrogate is sent as its ``\\u``
escape rather than failing in the socket's UTF-8 encoder.
"""

from __future__ import annotations

import json
import math
import typing
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import attrs
import cattrs
from cattrs.cols import is_sequence, list_structure_factory
from cattrs.gen import make_dict_unstructure_fn

#: A WebSocket message over this many bytes is a protocol violation (§2).
MAX_MESSAGE_BYTES = 4 * 1024 * 1024

#: Heartbeat period bounds and default (§2, ``hello``).
HEARTBEAT_MIN_S = 5.0
HEARTBEAT_MAX_S = 120.0
HEARTBEAT_DEFAULT_S = 15.0


#: Python refuses to turn a longer digit string into an int (``sys.int_info``'s
#: default string-digits limit), and parsing one takes quadratic time anyway.
MAX_INT_DIGITS = 4300


class DecodeError(ValueError):
    """A message that is not JSON, has no string ``type``, or has a malformed field."""


class UnreadableNumber:
    """Stands in for a JSON number this harness cannot hold: an integer of over
    4,300 digits, ``NaN``, ``Infinity``, or a float out of range.

    It is no ``int`` or ``float``, so every typed field refuses it (a timestamp that
    is one is "not an integer": 401), and it cannot be encoded back (a ``ping``
    whose id holds one is answered with a null id).
    """

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        #: The number as the server wrote it, cut short.
        self.text = text[:40]

    def __repr__(self) -> str:
        return f"UnreadableNumber({self.text!r})"


def _lenient_int(digits: str) -> int | UnreadableNumber:
    if len(digits) > MAX_INT_DIGITS + 1:  # + 1 for a minus sign
        return UnreadableNumber(digits)
    try:
        return int(digits)
    except ValueError:  # a lower PYTHONINTMAXSTRDIGITS than ours
        return UnreadableNumber(digits)


def _lenient_float(text: str) -> float | UnreadableNumber:
    value = float(text)
    return value if math.isfinite(value) else UnreadableNumber(text)


def _strict_int(digits: str) -> int:
    value = _lenient_int(digits)
    if isinstance(value, UnreadableNumber):
        raise ValueError(f"a number of {len(digits)} digits is too long")
    return value


def _strict_float(text: str) -> float:
    value = _lenient_float(text)
    if isinstance(value, UnreadableNumber):
        raise ValueError(f"the number {value.text} is out of range")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"the key {key[:40]!r} appears twice in one object")
            seen.add(key)
    return result


def loads_lenient(text: str | bytes) -> Any:
    """``json.loads`` for a whole WebSocket message, which never raises anything but
    ``ValueError``: an unreadable number becomes an :class:`UnreadableNumber`, and
    nesting too deep for the parser (about 1,000 levels) is a ``ValueError``.
    Duplicate keys: the last one wins, as everywhere in Python and JavaScript.
    """
    try:
        return json.loads(
            text,
            parse_int=_lenient_int,
            parse_float=_lenient_float,
            parse_constant=UnreadableNumber,
        )
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except UnicodeDecodeError as exc:  # bytes that are not UTF-8
        raise ValueError(str(exc)) from None


def loads_strict(text: str) -> Any:
    """``json.loads`` for text that must be plain RFC 8259 JSON (a run's body):
    raises ``ValueError`` for ``NaN``/``Infinity``, numbers Python cannot hold, a key
    repeated within one object, and nesting too deep for the parser.
    """
    try:
        return json.loads(
            text,
            parse_int=_strict_int,
            parse_float=_strict_float,
            parse_constant=_no_constant,
            object_pairs_hook=_unique_keys,
        )
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _strict(kind: type[Any]) -> Callable[[Any, type[Any]], Any]:
    """A structure hook that checks the type instead of coercing (cattrs' default)."""

    def hook(value: Any, _: type[Any]) -> Any:
        # bool is an int subclass; a JSON true is never a count or a timestamp.
        if isinstance(value, bool) and kind is not bool:
            raise TypeError(f"expected {kind.__name__}, got a boolean")
        if kind is float and isinstance(value, int):
            return float(value)
        if not isinstance(value, kind):
            raise TypeError(f"expected {kind.__name__}, got {type(value).__name__}")
        return value

    return hook


def _strict_list_factory(kind: Any, conv: cattrs.Converter) -> Callable[[Any, Any], Any]:
    """List hooks that refuse a dict or a string instead of iterating it."""
    inner = list_structure_factory(kind, conv)
    as_tuple = typing.get_origin(kind) is tuple

    def hook(value: Any, cls: Any) -> Any:
        if not isinstance(value, list):
            raise TypeError(f"expected a list, got {type(value).__name__}")
        items = inner(value, cls)
        return tuple(items) if as_tuple else items

    return hook


def _make_converter() -> cattrs.Converter:
    converter = cattrs.Converter()
    for kind in (str, int, float, bool):
        converter.register_structure_hook(kind, _strict(kind))
    converter.register_structure_hook_factory(is_sequence, _strict_list_factory)
    return converter


#: The one converter for every wire message and the run body.
converter = _make_converter()

M = TypeVar("M")


def describe_error(exc: BaseException, path: str = "message") -> str:
    """One readable line for a structuring failure, naming the field."""
    if isinstance(exc, cattrs.BaseValidationError):
        lines = []
        for line in cattrs.transform_error(exc, path=path):
            # cattrs says "invalid value for type, expected str @ body.text";
            # a reader wants the field first.
            what, _, where = line.rpartition(" @ ")
            what = what.replace("invalid value for type, ", "")
            lines.append(f"{where}: {what}" if where else line)
        return "; ".join(lines)
    return str(exc)


def structure(data: Any, cls: type[M], path: str = "message") -> M:
    """Structure ``data`` as ``cls``, raising :class:`DecodeError` with a field path."""
    try:
        return converter.structure(data, cls)
    except Exception as exc:  # ClassValidationError is an ExceptionGroup: catch plainly
        raise DecodeError(describe_error(exc, path)) from exc


# --------------------------------------------------------------------------- server → harness


@attrs.frozen
class Hello:
    TYPE: ClassVar[str] = "hello"
    heartbeat_s: Any = None
    server_time: Any = None
    features: Any = None

    def heartbeat_period(self) -> float:
        """The period the harness heartbeats at: clamped to 5–120 s, else 15 s."""
        value = self.heartbeat_s
        if isinstance(value, bool) or not isinstance(value, int | float):
            return HEARTBEAT_DEFAULT_S
        if value != value:  # NaN
            return HEARTBEAT_DEFAULT_S
        return min(HEARTBEAT_MAX_S, max(HEARTBEAT_MIN_S, float(value)))


@attrs.frozen
class Ping:
    TYPE: ClassVar[str] = "ping"
    id: Any = None


@attrs.frozen
class Delivery:
    TYPE: ClassVar[str] = "delivery"
    id: str
    event: Any = None
    timestamp: Any = None
    signature: Any = None
    body: Any = None


@attrs.frozen
class Cancel:
    TYPE: ClassVar[str] = "cancel"
    run_id: str
    reason: str | None = None


@attrs.frozen
class HeartbeatAck:
    TYPE: ClassVar[str] = "heartbeat_ack"
    seq: int | None = None
    cancel: list[str] = attrs.field(factory=list)
    unknown: list[str] = attrs.field(factory=list)


# --------------------------------------------------------------------------- harness → server


@attrs.frozen
class Ack:
    TYPE: ClassVar[str] = "ack"
    id: str
    status: int
    reason: str


@attrs.frozen
class Pong:
    TYPE: ClassVar[str] = "pong"
    id: Any = None


@attrs.frozen
class AccountRow:
    """One agent account as ``status.accounts`` lists it (§12)."""

    name: str
    #: ``ok``, ``warning`` (close to its limit) or ``limited``.
    state: str
    #: When its limit (or the reported window) resets, epoch s; ``None``: unknown.
    resets_at: int | None = None
    #: How much of its window is used, 0–100; ``None``: not reported.
    used_percent: float | None = None


@attrs.frozen
class Status:
    TYPE: ClassVar[str] = "status"
    version: str
    machine: str
    brain: str
    concurrency: int
    active: int
    queued: int
    draining: bool
    features: list[str] = attrs.field(factory=list)
    brain_version: str | None = None
    model: str | None = None
    #: The mode the latest run's agent was in (an ACP session's: ``--acp-mode``).
    mode: str | None = None
    #: Every agent account and its usage-limit state (§12).
    accounts: list[AccountRow] = attrs.field(factory=list)


@attrs.frozen
class RunBeat:
    """One run the harness holds, as listed in a heartbeat.

    Fields that are ``None`` are left out of the message: a queued run's entry is
    just ``run_id`` and ``state`` (§2), so that a heartbeat listing a full queue
    stays far below the 4 MiB message limit.
    """

    run_id: str
    state: str
    lane: str | None = None
    started_at: float | None = None
    activity: str | None = None
    #: The account the run's agent runs on (§12).
    account: str | None = None


converter.register_unstructure_hook(
    RunBeat, make_dict_unstructure_fn(RunBeat, converter, _cattrs_omit_if_default=True)
)


@attrs.frozen
class Heartbeat:
    TYPE: ClassVar[str] = "heartbeat"
    seq: int
    runs: list[RunBeat] = attrs.field(factory=list)


@attrs.frozen
class Unknown:
    """A message whose ``type`` this version does not know; ignored by both sides."""

    type: str


Message = (
    Hello | Ping | Delivery | Cancel | HeartbeatAck | Ack | Pong | Status | Heartbeat | Unknown
)

_BY_TYPE: dict[str, type[Any]] = {
    cls.TYPE: cls
    for cls in (Hello, Ping, Delivery, Cancel, HeartbeatAck, Ack, Pong, Status, Heartbeat)
}


def decode(text: str | bytes) -> Message:
    """Parse one WebSocket message.

    Raises :class:`DecodeError` for text that is not a JSON object with a string
    ``type``, or whose known type has a malformed field. Unknown types decode to
    :class:`Unknown` and unknown fields are dropped.
    """
    try:
        data = loads_lenient(text)
    except ValueError as exc:
        raise DecodeError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise DecodeError(f"not a JSON object but {type(data).__name__}")
    kind = data.get("type")
    if not isinstance(kind, str):
        raise DecodeError("no string 'type' field")
    cls = _BY_TYPE.get(kind)
    if cls is None:
        return Unknown(type=kind)
    result: Message = structure(data, cls)
    return result


def encode(message: Message) -> str:
    """Serialize a message as one compact JSON object with its ``type`` first."""
    if isinstance(message, Unknown):
        raise TypeError("an Unknown message cannot be sent")
    payload: dict[str, Any] = {"type": type(message).TYPE}
    payload.update(converter.unstructure(message))
    text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            # A lone surrogate (an ack's id, a pong's id as the server sent it):
            # ASCII escapes carry it exactly, and a socket can send them.
            text = json.dumps(payload, separators=(",", ":"))
    return text


def encode_pong(ping: Ping) -> str:
    """The answer to a ``ping``: its id echoed, whatever it holds, when that can be
    sent back; a null id when it cannot (an unreadable number in it, or nesting too
    deep to re-encode). Never raises.
    """
    try:
        return encode(Pong(id=ping.id))
    except (ValueError, TypeError, RecursionError):
        return encode(Pong(id=None))
