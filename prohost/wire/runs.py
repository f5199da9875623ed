"""The ``agent.run`` body (docs/protocol.md §3), its validation, lanes, and run outcomes.

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
from cattrs.gen import make_dict_unstructure_fn, override

from prohost.wire.changes import ChangeEntry
from prohost.wire.protocol import DecodeError, converter, loads_strict, structure
from prohost.wire.usage import Usage

_RUN_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
#: A JSON escape of a UTF-16 surrogate (high or low): ``\\ud800`` … ``\\udfff``.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
#: ``conversation_id`` is at most this many UTF-8 bytes (§3).
MAX_CONVERSATION_ID_BYTES = 256
#: A conversation's lane is this followed by its id (§4); a lone run's is ``run:<id>``.
CONVERSATION_LANE = "conv:"


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
            return CONVERSATION_LANE + self.conversation_id
        return f"run:{self.run_id}"


def valid_run_id(run_id: str) -> bool:
    """Whether ``run_id`` is one a body may carry (and so a file name of no other folder)."""
    return bool(_RUN_ID.fullmatch(run_id)) and run_id not in (".", "..")


def conversation_of(lane: str) -> str | None:
    """The conversation a lane (:attr:`AgentRun.lane`) is for; ``None`` for a run's own."""
    return lane[len(CONVERSATION_LANE):] if lane.startswith(CONVERSATION_LANE) else None


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


def _lone_surrogate(text: str) -> int | None:
    """The index of the first lone surrogate in ``text`` (not UTF-8-encodable), if any."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def _surrogate_field(data: Any) -> str | None:
    """The path of the first string (or key) in ``data`` holding a lone surrogate.

    Iterative, so that a body nested as deep as the JSON parser allows is walked
    without recursion of our own.
    """
    stack: list[tuple[str, Any]] = [("body", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if _lone_surrogate(value) is not None:
                return path
        elif isinstance(value, dict):
            for key, item in value.items():
                if _lone_surrogate(key) is not None:
                    return f"a key of {path}"
                stack.append((f"{path}.{key}", item))
        elif isinstance(value, list):
            stack.extend((f"{path}[{index}]", item) for index, item in enumerate(value))
    return None


def parse_body(body: str) -> AgentRun:
    """Validate the raw ``agent.run`` body text. Raises :class:`BodyError`.

    Text that cannot be encoded as UTF-8 (a lone surrogate, in the body itself or
    written as a ``\\ud800`` escape in any string of it) is refused, naming where:
    it could reach neither the agent, nor the ledger, nor the server intact.
    """
    index = _lone_surrogate(body)
    if index is not None:
        raise BodyError(f"body is not valid UTF-8: a lone surrogate at character {index}")
    try:
        data = loads_strict(body)
    except ValueError as exc:
        raise BodyError(f"body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BodyError("body is not a JSON object")
    # Only a \\u escape can put a surrogate into a parsed string; most bodies have none.
    if _SURROGATE_ESCAPE.search(body):
        where = _surrogate_field(data)
        if where is not None:
            raise BodyError(f"{where} holds a lone surrogate, which is not valid UTF-8")
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
    if run.run_id in (".", ".."):
        raise BodyError(f"body.run_id must not be {run.run_id!r}")
    if run.conversation_id is not None and not (
        1 <= len(run.conversation_id.encode("utf-8")) <= MAX_CONVERSATION_ID_BYTES
    ):
        raise BodyError(
            f"body.conversation_id must be 1–{MAX_CONVERSATION_ID_BYTES} bytes of UTF-8 "
            f"(it is {len(run.conversation_id.encode('utf-8'))})"
        )
    problem = path_problem(run.completion_path)
    if problem:
        raise BodyError(f"body.completion_path {problem}")
    if run.timeline_path is not None:
        problem = path_problem(run.timeline_path)
        if problem:
            raise BodyError(f"body.timeline_path {problem}")
    return run


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def encodable(data: Any) -> Any:
    """``data`` (JSON values) with every lone surrogate in its strings and keys
    written as U+FFFD: a name decoded with ``os.fsdecode`` holds one for each byte
    that is not UTF-8, and text holding one cannot be encoded as UTF-8."""
    if isinstance(data, str):
        return _LONE_SURROGATE.sub("\ufffd", data) if _lone_surrogate(data) is not None \
            else data
    if isinstance(data, dict):
        return {encodable(key): encodable(value) for key, value in data.items()}
    if isinstance(data, list):
        return [encodable(item) for item in data]
    return data


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
    #: Every attempt's usage, summed (§7); ``None`` when nothing is known.
    usage: Usage | None = None
    #: What the run changed in each checkout of its lane (§7; only with --repos).
    changes: list[ChangeEntry] | None = None
    #: The account that ran the reported attempt (docs/protocol.md §12); ``None`` when
    #: no agent ran (the run never started).
    account: str | None = None
    #: The agent ran confined (§13, §7 ``confined``); ``None`` (not sent) when no
    #: agent was spawned.
    confined: bool | None = None

    @classmethod
    def failure(cls, error: str, *, retryable: bool = False, **extra: Any) -> Outcome:
        return cls(ok=False, error=error, retryable=retryable, **extra)

    def completion(self, run_id: str) -> dict[str, Any]:
        """The JSON object POSTed to the completion path (§7)."""
        keys: dict[str, Any] = (_SUCCEEDED if self.ok else _FAILED)(self)
        # The one place every completion is made (posted first, or again from the
        # outbox): whatever reached the outcome (a path, the reply, a stderr line, a
        # session id, an error) goes out as valid UTF-8, or it could never be sent.
        completion: dict[str, Any] = encodable({"run_id": run_id, **keys})
        return completion

    def to_json(self) -> str:
        """The outcome as the ledger keeps it (every field, ``null`` included, but
        an unknown ``confined``: an outcome without it is kept as before it existed)."""
        data = converter.unstructure(self)
        if data.get("confined") is None:
            data.pop("confined", None)
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Outcome:
        return structure(json.loads(text), cls)


# A completion's keys after ``run_id`` (§7): a success sends its ``reply`` even when
# it is null and no ``error``/``retryable``; a failure sends ``error`` and
# ``retryable`` and no ``reply``; the rest only when known.
_SUCCEEDED = make_dict_unstructure_fn(
    Outcome, converter, _cattrs_omit_if_default=True, reply=override(omit_if_default=False),
    error=override(omit=True), retryable=override(omit=True))
_FAILED = make_dict_unstructure_fn(
    Outcome, converter, _cattrs_omit_if_default=True, reply=override(omit=True),
    error=override(omit_if_default=False), retryable=override(omit_if_default=False))
