"""The ``agent.run`` body (PROTOCOL.md §3), its validation, lanes, and run outcomes.

A run's body is validated once, when its delivery is classified; everything after
that works with the frozen :class:`AgentRun`. Validation errors name the field and
say why, because that text goes back to the server as the 400 ack's ``reason``.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from typing import Any

import attrs

from prohost.protocol import DecodeError, converter, structure

_RUN_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


class BodyError(ValueError):
    """The body cannot be run; the message becomes the 400 ack's reason."""


@attrs.frozen
class ContextMessage:
    text: str
    author: str | None = None
    at: float | None = None


@attrs.frozen
class Mcp:
    url: str
    token: str | None = None


@attrs.frozen
class AgentRun:
    run_id: str
    completion_path: str
    text: str
    conversation_id: str | None = None
    kind: str | None = None
    timeline_path: str | None = None
    author: str | None = None
    context: list[ContextMessage] = attrs.field(factory=list)
    instructions: str | None = None
    mcp: Mcp | None = None
    created_at: float | None = None

    @property
    def lane(self) -> str:
        """Runs on one lane never overlap (§4): the conversation, else the run itself."""
        if self.conversation_id:
            return f"conv:{self.conversation_id}"
        return f"run:{self.run_id}"


def path_problem(path: str) -> str | None:
    """Why ``path`` may not be used as an API path, or ``None`` when it is fine.

    A path must stay on the API host the harness already trusts with its token:
    no scheme, no authority (``//host``), no backslash, no ``..`` segment even
    percent-encoded (decoded repeatedly, so ``%252e`` does not slip through).
    """
    if len(path) < 2 or path[0] != "/" or path[1] == "/":
        return "must start with one '/' followed by a path"
    decoded = path
    for _ in range(5):
        unquoted = urllib.parse.unquote(decoded)
        if unquoted == decoded:
            break
        decoded = unquoted
    if "\\" in decoded:
        return "must not contain '\\'"
    if any(ord(ch) < 0x21 or ord(ch) == 0x7F for ch in decoded):
        return "must not contain spaces or control characters"
    if decoded.startswith("//") or "://" in decoded.split("?", 1)[0]:
        return "must be a path on the API host, not a URL"
    segments = decoded.split("?", 1)[0].split("/")
    if any(segment in ("..", ".") for segment in segments):
        return "must not contain a '..' or '.' segment"
    return None


def parse_body(body: str) -> AgentRun:
    """Validate the raw ``agent.run`` body text. Raises :class:`BodyError`."""
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise BodyError(f"body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BodyError("body is not a JSON object")
    for name in ("run_id", "completion_path", "text"):
        if name not in data or data[name] is None:
            raise BodyError(f"body.{name} is required")
    if data.get("context") is None:
        data = {**data, "context": []}
    try:
        run = structure(data, AgentRun, path="body")
    except DecodeError as exc:
        raise BodyError(str(exc)) from None
    if not _RUN_ID.fullmatch(run.run_id):
        raise BodyError("body.run_id must be 1–128 characters of A-Z a-z 0-9 . _ : -")
    problem = path_problem(run.completion_path)
    if problem:
        raise BodyError(f"body.completion_path {problem}")
    if run.timeline_path is not None:
        problem = path_problem(run.timeline_path)
        if problem:
            raise BodyError(f"body.timeline_path {problem}")
    return run


@attrs.frozen
class Outcome:
    """What a run ended with: the completion to post, minus the ``run_id``.

    ``reply`` is ``None`` for ``NO_REPLY`` (the key is still sent). ``retryable`` is
    only sent for failures.
    """

    ok: bool
    reply: str | None = None
    error: str | None = None
    retryable: bool = False
    session_id: str | None = None
    duration_ms: int | None = None
    usage: dict[str, Any] | None = None

    @classmethod
    def failure(cls, error: str, *, retryable: bool = False, **extra: Any) -> Outcome:
        return cls(ok=False, error=error, retryable=retryable, **extra)

    def completion(self, run_id: str) -> dict[str, Any]:
        """The JSON object POSTed to the completion path (§7)."""
        payload: dict[str, Any] = {"run_id": run_id, "ok": self.ok}
        if self.ok:
            payload["reply"] = self.reply
        else:
            payload["error"] = self.error
            payload["retryable"] = self.retryable
        for key in ("session_id", "duration_ms", "usage"):
            value = getattr(self, key)
            if value is not None:
                payload[key] = value
        return payload

    def to_json(self) -> str:
        return json.dumps(converter.unstructure(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Outcome:
        return structure(json.loads(text), cls)
