"""Every WebSocket message of PROTOCOL.md §2, and the one converter that reads them.

Both sides use this module: the harness decodes what the server sends, and the
reference server decodes what the harness sends. Decoding is strict about types
(a number is never silently turned into a string) and lenient about the rest:
unknown fields are ignored and an unknown ``type`` decodes to :class:`Unknown`, so a
newer server can add messages without breaking an older harness.

The ``delivery`` message is deliberately loose: only its ``id`` must be a string,
because a delivery that has an id can always be acked, and the ack's status (400,
401, 413…) is decided later by :mod:`prohost.intake`, which wants to see the raw
values to say precisely what was wrong.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import attrs
import cattrs
from cattrs.cols import is_sequence, list_structure_factory

#: A WebSocket message over this many bytes is a protocol violation (§2).
MAX_MESSAGE_BYTES = 4 * 1024 * 1024

#: Heartbeat period bounds and default (§2, ``hello``).
HEARTBEAT_MIN_S = 5.0
HEARTBEAT_MAX_S = 120.0
HEARTBEAT_DEFAULT_S = 15.0


class DecodeError(ValueError):
    """A message that is not JSON, has no string ``type``, or has a malformed field."""


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


@attrs.frozen
class RunBeat:
    """One run the harness holds, as listed in a heartbeat."""

    run_id: str
    state: str
    lane: str
    started_at: float | None = None
    activity: str | None = None


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
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
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
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
