"""What a brain is: how one agent CLI is invoked and how its output is read.

The runner knows nothing about any particular CLI. For each attempt it asks the
brain for a command line, feeds every stdout line to a fresh :class:`Turn`, and at
the end asks the turn what the run came to (and, in ``Turn.limit``, what the CLI
said about its account's usage limit). Adding a brain means adding a module
here and a line in :func:`prohost.engine.agent.brains.brain_for`; the runner does not change.
"""

from __future__ import annotations

import abc
import json
import os
import re
import time
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import attrs

from prohost.engine.accounts.limits import LimitNotice
from prohost.engine.agent.launch import Conversation
from prohost.engine.agent.process import ProcessResult
from prohost.execline import split_command
from prohost.wire.runs import Mcp, Outcome
from prohost.wire.timeline import ToolEvent
from prohost.wire.usage import Usage

#: A tool summary is one short line in a chat thread.
SUMMARY_CHARS = 120


def one_line(text: str, limit: int = SUMMARY_CHARS) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


#: A JSON escape of a UTF-16 surrogate (``\ud800``…``\udfff``, any case): only a
#: line holding one can decode to a string with a lone surrogate in it.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def decode_json_line(line: bytes) -> dict[str, Any] | None:
    """One line of a JSON-lines stream as an object, or ``None`` for anything else
    (blank lines, progress noise, a CLI's warnings on stdout).

    Text that is not valid Unicode is mended rather than refused, so that an event
    (the result, with the reply) is never lost to one bad character: a byte that is
    not UTF-8 becomes U+FFFD, and so does a lone surrogate escape. Claude Code writes
    its events with ``JSON.stringify``, which since ES2019 escapes a lone surrogate
    as ``"\\ud800"`` instead of failing (the "well-formed JSON.stringify" change),
    so a model's half of an emoji cut at a boundary reaches this line as such an
    escape; Python then holds it as a str that no UTF-8 encoder (the reply's cap,
    the report's JSON, the ledger) accepts.
    """
    stripped = line.strip()
    if not stripped.startswith(b"{"):
        return None
    try:
        # json.loads(bytes) would decode strictly and drop the whole event.
        value = json.loads(stripped.decode("utf-8", errors="replace"))
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    if _SURROGATE_ESCAPE.search(stripped):
        value = _without_surrogates(value)
    return value if isinstance(value, dict) else None


def _without_surrogates(value: Any) -> Any:
    """``value`` (decoded JSON) with every lone surrogate in its strings (keys too)
    replaced by U+FFFD. A surrogate *pair* escape was already joined by ``json``
    into one character, so any surrogate left is a lone one."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_without_surrogates(item) for item in value]
    if isinstance(value, dict):
        return {_without_surrogates(key): _without_surrogates(item)
                for key, item in value.items()}
    return value


@attrs.frozen
class McpWiring:
    """How a run's MCP server is handed to the agent: extra arguments and variables."""

    args: tuple[str, ...] = ()
    env: Mapping[str, str] = attrs.field(factory=dict)
    #: Servers a brain hands its agent in its own protocol rather than on the
    #: command line (ACP ``McpServer`` objects for ``session/new``).
    servers: tuple[Mapping[str, Any], ...] = ()


class McpError(Exception):
    """The run's MCP configuration could not be prepared; the run fails closed."""


#: The name the run's MCP server gets in the CLI's configuration; its tools then
#: appear to the agent (and in the timeline) under this server name
#: (``mcp__prohost__<tool>`` in Claude Code).
MCP_SERVER_NAME = "prohost"


def check_mcp(mcp: Mcp, *, transport: str = "") -> None:
    """Raise :class:`McpError` unless the CLI can reach ``mcp``: an http(s) URL
    without spaces or control characters, and a token an HTTP header can carry
    (every brain sends it as ``Authorization: Bearer``). ``transport`` is added to
    the URL's error, to say why only HTTP will do. The URL is never echoed: a
    query string may carry a credential."""
    parts = urllib.parse.urlsplit(mcp.url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise McpError("its URL is not an http:// or https:// URL"
                       + (f" ({transport})" if transport else ""))
    if any(char.isspace() or ord(char) < 0x20 or ord(char) == 0x7F for char in mcp.url):
        raise McpError("its URL contains spaces or control characters")
    if mcp.token and any(char in mcp.token for char in "\r\n\0"):
        raise McpError("its token contains characters an HTTP header cannot carry")


class Turn(abc.ABC):
    """One attempt's reading of the agent's output.

    ``feed`` is called with every stdout line (without its newline) as it arrives,
    from the task reading the pipe: it must be quick and must not raise for any
    input. ``finish`` is called once, after the process is gone.
    """

    #: The session (Claude) or thread (Codex) this attempt is in, once seen.
    session_id: str | None = None
    #: What the agent is doing now, for heartbeats: "Bash: pytest -q".
    activity: str | None = None
    #: The model the agent reports using, once seen.
    model: str | None = None
    #: The agent's mode (an ACP session's, ``--acp-mode``), once known.
    mode: str | None = None
    #: The CLI said its session started (an init event): a later non-zero exit is
    #: then a failure of the work, not a rejected resume.
    started: bool = False
    #: The last error the CLI reported in its stream (Codex's "Reconnecting…
    #: waiting for network"): said alongside a timeout, it tells the sender why.
    last_error: str | None = None
    #: What the CLI said about its account's usage limit (None: nothing). The
    #: attempt ended *because of* the limit when ``finish`` gave a failure and
    #: this is ``limited``; the failure's error then says the limit was reached.
    limit: LimitNotice | None = None
    #: For a CLI that reports its session's running totals (Codex): what the
    #: resumed session had reached before this attempt (set before it starts).
    usage_before: Usage = Usage()
    #: The CLI stopped the attempt at its budget (``--max-cost``, §12): the runner
    #: then says the run's budget and what the whole run spent.
    reached_budget: bool = False

    def feed(self, line: bytes) -> list[ToolEvent]:
        """Read one stdout line; return the timeline events it produced."""
        return []

    def usage(self) -> Usage:
        """What this attempt used, as far as the CLI said (§7); empty when nothing."""
        return Usage()

    def session_totals(self) -> Usage | None:
        """The session's running totals after this attempt, for a CLI that reports
        them (kept with the session, so the next turn's figures are its own)."""
        return None

    @abc.abstractmethod
    def finish(self, result: ProcessResult) -> Outcome | None:
        """The outcome this attempt's output stands for, or ``None`` to let the
        runner describe a process failure (exit status, timeout) in its words.

        Called only when the process ended without a timeout. The returned
        outcome's ``reply`` is the reply to send, said once by
        :func:`prohost.engine.agent.reply.final_reply` (trimmed, ``None`` for
        ``NO_REPLY``, capped); ``session_id``, ``usage`` may be set.
        """

    def resume_rejected(self, result: ProcessResult) -> bool:
        """Whether this attempt failed because the resumed session is unknown."""
        return False

    def conversation(self, prompt: str, session_id: str | None, cwd: Path,
                     mcp: McpWiring | None = None,
                     env: Mapping[str, str] | None = None) -> Conversation | None:
        """For a brain that talks with its agent over stdin while it runs (ACP): the
        conversation that carries ``prompt`` in ``session_id`` (``None``: a new
        session) with the agent working in ``cwd`` and the run's ``mcp`` wiring;
        ``env`` is the agent's environment (which keys it can log in with).
        ``None`` (the default): the prompt is written to stdin, then end-of-file."""
        return None

    def ended_by_limit(self, outcome: Outcome | None) -> bool:
        """Whether this attempt failed because its account reached its usage limit
        (``outcome`` is what :meth:`finish` returned): the run may go to another
        account. A success with a ``limited`` notice (the work got done just before
        the refusal) did not end by the limit, though the account is limited now."""
        failed = outcome is None or not outcome.ok
        return failed and self.limit is not None and self.limit.state == "limited"


def with_limit(error: str, limit: LimitNotice | None, cli: str) -> str:
    """``error``, saying so when ``limit`` (what the CLI said about its account's
    usage limit) is ``limited``: ``<error> (Codex usage limit reached; it resets at
    2026-02-18 13:05 UTC)``. ``cli`` names the CLI, ``Claude`` or ``Codex``."""
    if limit is None or limit.state != "limited":
        return error
    if limit.resets_at is None:
        return f"{error} ({cli} usage limit reached; it did not say when it resets)"
    resets = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(limit.resets_at))
    return f"{error} ({cli} usage limit reached; it resets at {resets})"


class Brain(abc.ABC):
    """One agent CLI."""

    name: ClassVar[str]
    #: stdout is a JSON event stream read line by line (else it is the reply).
    streams: ClassVar[bool] = False
    #: The CLI can stop a run at ``--max-cost`` and say what it spent (§12).
    bounds_cost: ClassVar[bool] = False
    #: Its usage figures are the session's running totals, not the turn's (Codex):
    #: the runner hands each resumed attempt what its session had reached.
    running_totals: ClassVar[bool] = False
    #: Why it cannot, for the refusal at start (names what is missing).
    no_budget_because: ClassVar[str] = "it cannot bound or report what a run spends"

    def __init__(self, exec_line: str, *, safe_tools: bool = False,
                 max_cost_usd: float | None = None) -> None:
        self.exec_line = exec_line
        self.safe_tools = safe_tools
        #: --max-cost: what one run may spend (US dollars); only a brain that
        #: :attr:`bounds_cost` is ever given one.
        self.max_cost_usd = max_cost_usd

    @abc.abstractmethod
    def command(self, *, session_id: str | None, mcp: McpWiring | None,
                max_cost_usd: float | None = None) -> str:
        """The shell command line for one attempt (the prompt goes to stdin).
        ``max_cost_usd``: what this attempt may spend, what is left of the run's
        ``--max-cost`` (``None``: all of it); only a brain that :attr:`bounds_cost`
        reads it."""

    @property
    def folders_owner(self) -> str:
        """Whose own folders a confined run is granted (§13): the brain's CLI; for
        the ACP brain the agent its command line starts (each has folders of its
        own)."""
        return self.name

    def budget_in_force(self) -> float | None:
        """The budget the CLI is held to, for the words of a run that reached it:
        ``--max-cost`` unless the user's own ``--exec`` line sets one that wins."""
        return self.max_cost_usd

    @abc.abstractmethod
    def new_turn(self) -> Turn:
        """A fresh reader for one attempt."""

    def version_command(self) -> str | None:
        """A shell command that prints the CLI's version, or ``None``."""
        return None

    def configured_model(self) -> str | None:
        """The model named on the command line (``--model X``), if any."""
        words = split_command(self.exec_line)
        for index, word in enumerate(words):
            if word in ("--model", "-m") and index + 1 < len(words):
                return words[index + 1]
            if word.startswith("--model="):
                return word.split("=", 1)[1]
        return None

    def before_spawn(self, session_id: str | None, env: Mapping[str, str],
                     kept_at: Callable[[Path], Path]) -> None:
        """Mend the agent's own saved state before an attempt resumes ``session_id``
        (``None``: a fresh session), for an agent whose saved sessions need it
        (Gemini CLI's). ``env`` is the agent's environment; ``kept_at`` maps a path
        as the agent sees it to where the harness reaches it (an ACP agent's folders
        are the harness's, seen at the person's). Never raises. Blocking (file
        I/O): call it in a worker thread. The default does nothing."""
        return None

    def wire_mcp(self, mcp: Mcp, folder: Path,
                 env: Mapping[str, str] | None = None) -> McpWiring:
        """Write this run's MCP configuration into ``folder`` (mode 0700, removed
        after the run) and say how to pass it. ``env`` is the environment the
        agent gets (its account's variables included), for a brain whose
        configuration is built over the CLI's own folder. Raises :class:`McpError`.
        Blocking (file I/O): call it in a worker thread."""
        raise McpError(f"the {self.name} brain cannot use an MCP server")


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to a new file readable by this user only (0600 from creation)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
