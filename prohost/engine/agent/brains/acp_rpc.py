"""JSON-RPC 2.0 as an ACP agent speaks it on its stdio: one message per line.

The Agent Client Protocol's stdio transport (agentclientprotocol/agent-client-protocol,
``docs/protocol/v1/transports.mdx``) sends JSON-RPC 2.0 requests, notifications and
responses, UTF-8, each on one line without embedded newlines, the agent's on its
stdout and the client's on its stdin. This module reads one line into the message
it is (a request or notification from the agent, or a response to one of ours) and
writes ours; nothing here knows ACP's methods (:mod:`prohost.engine.agent.brains.acp`
does).

Reading is lenient, as the other brains' readers are: a line that is not a JSON-RPC
message (an agent's log on the wrong stream) is ``None``, never an exception.
"""

from __future__ import annotations

import json
import re
from typing import Any

import attrs

from prohost.engine.agent.brains.base import decode_json_line

#: JSON-RPC's and ACP's error codes this client sends or reads (ACP ``ErrorCode``,
#: ``schema/v1/schema.json``).
METHOD_NOT_FOUND = -32601
INTERNAL_ERROR = -32603
AUTH_REQUIRED = -32000
RESOURCE_NOT_FOUND = -32002
REQUEST_CANCELLED = -32800

MessageId = int | str


@attrs.frozen
class RpcError:
    """A JSON-RPC error object: ``code``, ``message`` and optional ``data``."""

    code: int
    message: str
    data: Any = None

    def text(self) -> str:
        """The error in one sentence for a failure: its message, and its data when
        that is a string or carries a ``message`` (agents put the cause there)."""
        said = self.message.strip() or f"JSON-RPC error {self.code}"
        detail = self.data
        if isinstance(detail, dict):
            detail = detail.get("message") or detail.get("details") or detail.get("error")
        if isinstance(detail, str) and detail.strip() and detail.strip() not in said:
            said = f"{said}: {detail.strip()}"
        return said


@attrs.frozen
class Request:
    """A request from the agent (it waits for our response)."""

    id: MessageId
    method: str
    params: dict[str, Any]


@attrs.frozen
class Notification:
    """A notification from the agent (no response)."""

    method: str
    params: dict[str, Any]


@attrs.frozen
class Response:
    """The agent's response to one of our requests: a ``result`` (any JSON, ``null``
    included) or an ``error``."""

    id: MessageId
    result: Any = None
    error: RpcError | None = None


Message = Request | Notification | Response


def read_message(line: bytes) -> Message | None:
    """The JSON-RPC message on one stdout line, or ``None`` when it is none."""
    data = decode_json_line(line)
    if data is None or data.get("jsonrpc") != "2.0":
        return None
    method = data.get("method")
    params = data.get("params")
    if not isinstance(params, dict):
        params = {}
    raw_id = data.get("id")
    message_id: MessageId | None = (
        raw_id if isinstance(raw_id, int | str) and not isinstance(raw_id, bool) else None)
    if isinstance(method, str):
        if message_id is not None:
            return Request(id=message_id, method=method, params=params)
        return Notification(method=method, params=params)
    if message_id is None:
        return None
    error = data.get("error")
    if isinstance(error, dict):
        code = error.get("code")
        message = error.get("message")
        return Response(id=message_id, error=RpcError(
            code=code if isinstance(code, int) and not isinstance(code, bool) else 0,
            message=message if isinstance(message, str) else "",
            data=error.get("data")))
    if "result" not in data:
        return None
    return Response(id=message_id, result=data["result"])


def _line(message: dict[str, Any]) -> bytes:
    # ensure_ascii keeps every line free of raw newlines and of bytes that are not
    # UTF-8 (a lone surrogate in a prompt is escaped, not an encoding error).
    return json.dumps(message, separators=(",", ":"), ensure_ascii=True).encode() + b"\n"


def request(message_id: MessageId, method: str, params: dict[str, Any]) -> bytes:
    return _line({"jsonrpc": "2.0", "id": message_id, "method": method, "params": params})


def notification(method: str, params: dict[str, Any]) -> bytes:
    return _line({"jsonrpc": "2.0", "method": method, "params": params})


def result(message_id: MessageId, value: Any) -> bytes:
    return _line({"jsonrpc": "2.0", "id": message_id, "result": value})


def error(message_id: MessageId, code: int, message: str) -> bytes:
    return _line({"jsonrpc": "2.0", "id": message_id,
                  "error": {"code": code, "message": message}})


#: A request's id and method at the start of a line too long to read whole.
_HEAD_ID = re.compile(r'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.)*")')
_HEAD_METHOD = re.compile(r'"method"\s*:\s*"([^"\\]+)"')
_HEAD_OPTIONS = re.compile(r'"options"\s*:\s*')


def read_head(head: bytes) -> tuple[MessageId, str, list[Any] | None] | None:
    """The id and method of a request whose line was too long to read, from its
    start (the SDKs write ``jsonrpc``, ``id``, ``method``, then ``params``), and its
    ``params.options`` array when the start holds all of it; ``None`` when the
    start shows no request (a notification or a response waits for no answer)."""
    text = head.decode("utf-8", errors="replace")
    start = text[:text.find('"params"')] if '"params"' in text else ""
    found_id = _HEAD_ID.search(start)
    found_method = _HEAD_METHOD.search(start)
    if found_id is None or found_method is None:
        return None
    message_id = json.loads(found_id.group(1))
    if not isinstance(message_id, int | str) or isinstance(message_id, bool):
        return None
    options = None
    found = _HEAD_OPTIONS.search(text, len(start))
    if found is not None:
        try:
            value, _ = json.JSONDecoder().raw_decode(text, found.end())
        except ValueError:
            value = None
        options = value if isinstance(value, list) else None
    return message_id, found_method.group(1), options
