"""The Codex brain: ``codex exec --json`` and its JSON-lines event stream.

Every attempt is one ``codex exec`` process and one turn of a Codex *thread*. The
first turn of a lane starts a thread; later turns resume it with
``codex exec [flags] resume <thread_id> -``. The prompt always goes on stdin
(the trailing ``-``), never on the command line, where ``ps`` would show it.

The event stream (``codex-rs/exec/src/exec_events.rs`` in openai/codex) is one
JSON object per line::

    {"type":"thread.started","thread_id":"0199a213-…"}
    {"type":"turn.started"}
    {"type":"item.started","item":{"id":"item_1","type":"command_execution",
        "command":"bash -lc 'pytest -q'","aggregated_output":"","exit_code":null,
        "status":"in_progress"}}
    {"type":"item.completed","item":{"id":"item_2","type":"agent_message","text":"Done."}}
    {"type":"turn.completed","usage":{"input_tokens":1200,"cached_input_tokens":200,
        "output_tokens":345}}

and, when things go wrong, ``{"type":"error","message":…}`` (also used for
transient "reconnecting" notices, so it is not fatal by itself) and
``{"type":"turn.failed","error":{"message":…}}``. At the account's usage limit
both carry Codex's "You've hit your usage limit. … Try again at …" text, which
becomes ``Turn.limit`` (see :mod:`prohost.engine.limits`). The reply is the text of the
last completed ``agent_message`` item, which is what ``codex exec`` itself
writes for ``--output-last-message``.
"""

# Over ~450 lines on purpose: one brain: the CLI's command line, its event stream
# and its MCP overlay, each read against recorded output of the real CLI.

from __future__ import annotations

import logging
import os
import shlex
import time
import tomllib
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from prohost.engine.agentproc import ProcessResult
from prohost.engine.brains.base import (
    Brain,
    McpError,
    McpWiring,
    ToolEvent,
    ToolState,
    Turn,
    decode_json_line,
    has_flag,
    one_line,
    split_command,
    write_private,
)
from prohost.engine.limits import codex_limit_text, codex_rate_limits, merge
from prohost.wire.runs import Mcp, Outcome

log = logging.getLogger("prohost.brains.codex")

#: The name the run's MCP server gets in Codex's ``mcp_servers`` table; its tools
#: show up to the model under this server name.
MCP_SERVER_NAME = "prohost"
#: Codex's configuration folder (login, config.toml, sessions, logs).
CODEX_HOME_ENV = "CODEX_HOME"
#: Folders of CODEX_HOME Codex writes a run's state into: made in the real home
#: before an overlay links to them, so nothing a run keeps is lost with it.
_CODEX_SHARED_DIRS = ("sessions", "log")

#: Words that precede the real program on a command line (as in ``program_name``).
_PREFIX_WORDS = frozenset({"env", "exec", "command", "nice", "nohup"})

#: What Codex says when ``resume <id>`` names a thread it cannot load, across
#: versions: the app-server-based exec (0.1xx) prints
#: ``Error: thread/resume: thread/resume failed: no rollout found for thread id <id>
#: (code -32600)``; earlier builds ``No saved session found with ID <id>``; the
#: app-server also answers ``thread not found`` / ``thread not loaded``, and
#: 0.99 logged ``state db missing rollout path for thread <id>``.
_UNKNOWN_THREAD_MARKERS = (
    "no rollout found",
    "rollout not found",
    "no saved session found",
    "thread not found",
    "thread not loaded",
    "missing rollout path",
)

#: Timeline names per item type, kept close to Claude's tool names so a thread
#: reads the same whichever agent ran.
_TOOL_NAMES = {
    "command_execution": "Bash",
    "file_change": "Edit",
    "mcp_tool_call": "MCP",
    "web_search": "WebSearch",
}

#: Item statuses that mean the tool did not do what was asked. ``declined`` is a
#: command the sandbox or policy refused to run.
_FAILED_STATUSES = frozenset({"failed", "declined"})


class CodexTurn(Turn):
    """Reads one ``codex exec --json`` attempt."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        #: Reads "Try again at 2:57 PM" relative to now (epoch s); tests pass their own.
        self._clock = clock
        self.reply: str | None = None
        self.usage: dict[str, Any] | None = None
        self.turn_failed: str | None = None
        self.last_error: str | None = None
        #: Tools still running: id → activity text, oldest first.
        self._open: dict[str, str] = {}
        self._unnamed = 0

    def feed(self, line: bytes) -> list[ToolEvent]:
        event = decode_json_line(line)
        if event is None:
            return []
        try:
            return self._event(event)
        except Exception:
            # The contract is "never raise": a shape no version of Codex emits
            # must not take down the pipe reader and with it the run.
            log.debug("skipped a codex event it could not read", exc_info=True)
            return []

    def _event(self, event: dict[str, Any]) -> list[ToolEvent]:
        kind = event.get("type")
        if kind == "thread.started":
            thread_id = event.get("thread_id")
            if isinstance(thread_id, str) and thread_id:
                self.session_id = thread_id
            self.started = True
        elif kind in ("item.started", "item.updated", "item.completed"):
            item = event.get("item")
            if isinstance(item, dict):
                return self._item(kind, item)
        elif kind == "turn.completed":
            self.activity = None
            usage = event.get("usage")
            if isinstance(usage, dict):
                self.usage = {
                    key: value
                    for key, value in usage.items()
                    if isinstance(value, int | float) and not isinstance(value, bool)
                }
        elif kind == "turn.failed":
            self.activity = None
            error = event.get("error")
            message = error.get("message") if isinstance(error, dict) else None
            self.turn_failed = _text(message) or "the Codex turn failed"
            self._limit_text(self.turn_failed)
        elif kind == "error":
            message = _text(event.get("message"))
            if message:
                self.last_error = message
                self._limit_text(message)
        else:
            self._rate_limits(event)
        return []

    def _limit_text(self, message: str) -> None:
        """Codex's usage-limit error (``UsageLimitReachedError`` in openai/codex
        ``codex-rs/core/src/error.rs``) arrives as an ``error`` event and again as
        ``turn.failed``; either one marks the account limited."""
        notice = codex_limit_text(message, self._clock())
        if notice is not None:
            self.limit = merge(self.limit, notice)

    def _rate_limits(self, event: dict[str, Any]) -> None:
        """Rate-limit figures from a ``token_count`` event, in the shapes Codex has
        printed them: the protocol ``Event`` of older ``codex exec --json``
        (``{"id":"0","msg":{"type":"token_count","info":…,"rate_limits":…}}``,
        ``EventMsg::TokenCount`` in ``codex-rs/protocol/src/protocol.rs``), a session
        rollout line (``{"type":"event_msg","payload":{"type":"token_count",…}}``)
        or the bare ``token_count`` object. The current exec JSONL
        (``exec_events.rs``) carries none, so this is often never reached."""
        body: Any = event
        for key in ("msg", "payload"):
            inner = event.get(key)
            if isinstance(inner, dict):
                body = inner
        if body.get("type") != "token_count":
            return
        notice = codex_rate_limits(body.get("rate_limits"), self._clock())
        if notice is not None:
            self.limit = merge(self.limit, notice)

    def _item(self, kind: str, item: dict[str, Any]) -> list[ToolEvent]:
        item_type = item.get("type")
        if item_type == "agent_message":
            if kind == "item.completed":
                text = item.get("text")
                if isinstance(text, str):
                    self.reply = text
            return []
        if not isinstance(item_type, str) or item_type not in _TOOL_NAMES or kind == "item.updated":
            # reasoning, todo_list, error (non-fatal notices), plan, collab calls
            # and types a later Codex adds: nothing to show on the timeline.
            return []
        name = _TOOL_NAMES[item_type]
        item_id = item.get("id")
        if isinstance(item_id, str) and item_id:
            tool_id = item_id
        else:
            self._unnamed += 1
            tool_id = f"{item_type}-{self._unnamed}"
        summary = _summary(item_type, item)
        state: ToolState
        if kind == "item.started":
            state = "calling"
            self._open[tool_id] = f"{name}: {summary}" if summary else name
        else:
            state = "error" if _failed(item) else "done"
            self._open.pop(tool_id, None)
        # What runs now is the latest tool still open; between tools the model is
        # at work (the wording the Claude brain uses too).
        self.activity = next(reversed(self._open.values()), "thinking")
        return [ToolEvent(id=tool_id, name=name, state=state, summary=summary)]

    def finish(self, result: ProcessResult) -> Outcome | None:
        if self.turn_failed is not None:
            # Codex discards the turn's last message when the turn fails, and so
            # does this: a partial answer is not the reply.
            return Outcome.failure(self._with_limit(self.turn_failed),
                                   session_id=self.session_id)
        if self.reply is not None:
            if result.exit_code == 0:
                return Outcome(ok=True, reply=self.reply, session_id=self.session_id,
                               usage=self.usage)
            return None
        if self.last_error is not None:
            return Outcome.failure(self._with_limit(self.last_error),
                                   session_id=self.session_id)
        if result.exit_code != 0:
            return None
        why = "the Codex CLI ended without a reply (no agent message in its output)"
        if result.overlong_lines:
            why += f"; {result.overlong_lines} over-long output line(s) were skipped"
        return Outcome.failure(why, session_id=self.session_id)

    def _with_limit(self, error: str) -> str:
        """``error``, saying so when the account's usage limit ended the turn."""
        limit = self.limit
        if limit is None or limit.state != "limited":
            return error
        if limit.resets_at is None:
            return f"{error} (Codex usage limit reached; it did not say when it resets)"
        resets = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(limit.resets_at))
        return f"{error} (Codex usage limit reached; it resets at {resets})"

    def resume_rejected(self, result: ProcessResult) -> bool:
        if result.exit_code is None or result.exit_code == 0:
            return False
        if not self.started:
            # Codex resolves the thread before it announces it: failing before
            # thread.started is failing to resume (an unknown id, an unreadable
            # rollout); a fresh thread is the way on.
            return True
        said = [result.last_stderr_line, self.last_error or "", self.turn_failed or ""]
        return any(marker in text.lower() for text in said for marker in _UNKNOWN_THREAD_MARKERS)


class CodexBrain(Brain):
    name = "codex"
    streams = True

    def command(self, *, session_id: str | None, mcp: McpWiring | None) -> str:
        line = _with_exec_subcommand(self.exec_line)
        added: list[str] = []
        if not has_flag(line, "--json", "--experimental-json"):
            added.append("--json")
        if not has_flag(line, "--skip-git-repo-check"):
            # The working directory is often not a git checkout (the default
            # workspace); without this codex exec refuses to start there.
            added.append("--skip-git-repo-check")
        if not self.safe_tools and not has_flag(
            line,
            "--dangerously-bypass-approvals-and-sandbox", "--yolo",
            "--full-auto", "--sandbox", "-s", "--ask-for-approval", "-a",
        ):
            # Why not --full-auto: that is the workspace-write sandbox, which
            # blocks the network and every write outside the working directory,
            # so the lane's private checkouts ($PROHOST_RUN_REPOS, elsewhere) and
            # git pushes fail; it is also deprecated and then removed in newer
            # Codex. codex exec never asks for approval anyway, so the bypass
            # flag is what "runs unattended with the user's rights" means here,
            # matching what the Claude brain allows. A --sandbox/--full-auto the
            # user chose is kept (they conflict with the bypass flag).
            added.append("--dangerously-bypass-approvals-and-sandbox")
        if mcp is not None:
            added.extend(mcp.args)
        # Flags go before `resume`: older builds only accept exec's options there.
        # A thread id that looks like an option could only come from a corrupted
        # ledger; starting fresh beats handing codex an injected flag.
        if session_id and not session_id.startswith("-"):
            added += ["resume", session_id]
        added.append("-")  # read the prompt from stdin
        return line + " " + " ".join(shlex.quote(word) for word in added)

    def new_turn(self) -> Turn:
        return CodexTurn()

    def version_command(self) -> str | None:
        span = _program_span(self.exec_line)
        if span is None:
            return None
        return self.exec_line[: span[1]] + " --version"

    def configured_model(self) -> str | None:
        model = super().configured_model()
        if model is not None:
            return model
        # `-c model="o3"` sets it through the config overrides instead.
        words = split_command(self.exec_line)
        for index, word in enumerate(words):
            value = None
            if word in ("-c", "--config") and index + 1 < len(words):
                value = words[index + 1]
            elif word.startswith("--config="):
                value = word.split("=", 1)[1]
            if value is not None:
                key, sep, raw = value.partition("=")
                if sep and key.strip() == "model":
                    return raw.strip().strip("\"'") or None
        return None

    def wire_mcp(self, mcp: Mcp, folder: Path,
                 env: Mapping[str, str] | None = None) -> McpWiring:
        """The run's streamable-HTTP MCP server; its token in a private CODEX_HOME.

        The URL goes in ``-c`` overrides. A token goes nowhere a child of the agent
        could read it: not argv (``ps``), not the environment (every command the
        agent runs inherits it). Codex reads a static ``Authorization`` header
        from its config (``http_headers`` of an ``[mcp_servers.<name>]`` table:
        ``McpServerTransportConfig::StreamableHttp`` in openai/codex
        ``codex-rs/core/src/config/types.rs``, sent by ``build_default_headers`` in
        ``codex-rs/rmcp-client/src/utils.rs``), and its config lives in CODEX_HOME.
        So ``folder`` gets an overlay of the account's CODEX_HOME (``env``'s
        ``CODEX_HOME``, else ``~/.codex``): a symlink to each of its entries, so
        the login, sessions and logs are the real ones (a resumed thread is found,
        a new one is kept), and a ``config.toml`` (0600) = the real one plus the
        run's server. The agent gets ``CODEX_HOME`` pointing at the overlay.
        """
        parts = urllib.parse.urlsplit(mcp.url)
        # The URL is not echoed: a query string may carry a credential.
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise McpError(
                "its URL is not an http:// or https:// URL (Codex reaches MCP servers "
                "over streamable HTTP)"
            )
        if any(char.isspace() or ord(char) < 0x20 or ord(char) == 0x7F for char in mcp.url):
            raise McpError("its URL contains spaces or control characters")
        if mcp.token and any(char in mcp.token for char in "\r\n\0"):
            # Codex sends it as an HTTP header.
            raise McpError("its token contains characters an HTTP header cannot carry")
        prefix = f"mcp_servers.{MCP_SERVER_NAME}"
        args = (
            # Codex 0.4x only spoke streamable HTTP through the then-experimental
            # rmcp client; later builds made it the default and ignore the key.
            "-c", "experimental_use_rmcp_client=true",
            "-c", f"{prefix}.url={_toml_string(mcp.url)}",
        )
        if not mcp.token:
            return McpWiring(args=args)
        overlay = _codex_overlay(_codex_home(os.environ if env is None else env), folder,
                                 mcp.url, mcp.token)
        return McpWiring(args=args, env={CODEX_HOME_ENV: str(overlay)})


def _codex_home(env: Mapping[str, str]) -> Path:
    """The CODEX_HOME Codex would use with ``env``: the variable, else ``~/.codex``."""
    named = env.get(CODEX_HOME_ENV, "").strip()
    if named:
        return Path(named)
    home = env.get("HOME", "").strip()
    return (Path(home) if home else Path.home()) / ".codex"


def _codex_overlay(base: Path, folder: Path, url: str, token: str) -> Path:
    """``folder/codex-home``: ``base`` seen through symlinks, but for a private
    ``config.toml`` that adds the run's MCP server with its bearer header."""
    try:
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Made in the real home first: through the symlinks, Codex keeps the
        # run's thread (resumed by the lane's next turn) and its logs there.
        for shared in _CODEX_SHARED_DIRS:
            (base / shared).mkdir(mode=0o700, exist_ok=True)
        config = base / "config.toml"
        text = config.read_text(encoding="utf-8") if config.exists() else ""
    except (OSError, UnicodeDecodeError) as exc:
        raise McpError(f"could not read Codex's folder {base}: "
                       f"{getattr(exc, 'strerror', None) or exc}") from None
    try:
        existing = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise McpError(f"{config} is not valid TOML ({exc}); Codex could not read it "
                       "either: fix it") from None
    servers = existing.get("mcp_servers")
    if isinstance(servers, dict) and MCP_SERVER_NAME in servers:
        raise McpError(f"{config} already defines [mcp_servers.{MCP_SERVER_NAME}]; "
                       "rename that server, the run's own uses the name")
    table = (f"[mcp_servers.{MCP_SERVER_NAME}]\n"
             f"url = {_toml_string(url)}\n"
             f"http_headers = {{ Authorization = {_toml_string('Bearer ' + token)} }}\n")
    # A new table after the user's text: whatever table it ended in is closed.
    combined = (text.rstrip("\n") + "\n\n" if text.strip() else "") + table
    overlay = folder / "codex-home"
    overlay.mkdir(mode=0o700)
    overlay.chmod(0o700)
    for entry in sorted(base.iterdir()):
        if entry.name != "config.toml":
            (overlay / entry.name).symlink_to(entry)
    write_private(overlay / "config.toml", combined)
    return overlay


def _text(value: object) -> str | None:
    return (value.strip() or None) if isinstance(value, str) else None


def _failed(item: dict[str, Any]) -> bool:
    status = item.get("status")
    if isinstance(status, str) and status in _FAILED_STATUSES:
        return True
    exit_code = item.get("exit_code")
    if isinstance(exit_code, int) and not isinstance(exit_code, bool) and exit_code != 0:
        return True
    return item.get("type") == "mcp_tool_call" and isinstance(item.get("error"), dict)


def _summary(item_type: str, item: dict[str, Any]) -> str:
    if item_type == "command_execution":
        command = item.get("command")
        return one_line(_unwrap_shell(command)) if isinstance(command, str) else ""
    if item_type == "mcp_tool_call":
        server, tool = item.get("server"), item.get("tool")
        names = [part for part in (server, tool) if isinstance(part, str) and part]
        return one_line(".".join(names))
    if item_type == "file_change":
        changes = item.get("changes")
        paths = [
            change["path"]
            for change in (changes if isinstance(changes, list) else [])
            if isinstance(change, dict) and isinstance(change.get("path"), str)
        ]
        return one_line(", ".join(paths))
    if item_type == "web_search":
        query = item.get("query")
        if isinstance(query, str) and query.strip():
            return one_line(query)
        # Newer builds start the item before the query is known and describe
        # the search in `action` ({"type":"search","query":…} / open_page's url).
        action = item.get("action")
        if isinstance(action, dict):
            for key in ("query", "url", "pattern"):
                value = action.get(key)
                if isinstance(value, str) and value.strip():
                    return one_line(value)
    return ""


def _unwrap_shell(command: str) -> str:
    """``bash -lc 'pytest -q'`` → ``pytest -q``: the wrapper Codex runs every
    command in says nothing on a timeline."""
    words = split_command(command)
    if (
        len(words) == 3
        and os.path.basename(words[0]) in ("bash", "sh", "zsh")
        and words[1] in ("-c", "-lc")
    ):
        return words[2]
    return command


def _toml_string(value: str) -> str:
    """``value`` as a TOML basic string (what ``-c key=value`` parses)."""
    out = ['"']
    for char in value:
        if char == '"':
            out.append('\\"')
        elif char == "\\":
            out.append("\\\\")
        elif char == "\n":
            out.append("\\n")
        elif char == "\t":
            out.append("\\t")
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04X}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def _word_spans(line: str) -> list[tuple[int, int, str]]:
    """Each shell word of ``line`` as (start, end, unquoted value).

    Edits must keep the user's own text as written (``$HOME``, ``~`` and globs
    expand in the shell), so the line is cut at word boundaries rather than
    re-joined from ``shlex.split``.
    """
    spans: list[tuple[int, int, str]] = []
    index, size = 0, len(line)
    while index < size:
        if line[index].isspace():
            index += 1
            continue
        start, quote = index, ""
        while index < size:
            char = line[index]
            if quote == "'":
                if char == "'":
                    quote = ""
            elif char == "\\":
                index += 1  # the next character is escaped, whatever it is
            elif quote == '"':
                if char == '"':
                    quote = ""
            elif char.isspace():
                break
            elif char in "'\"":
                quote = char
            index += 1
        end = min(index, size)
        raw = line[start:end]
        words = split_command(raw)
        spans.append((start, end, words[0] if len(words) == 1 else raw))
    return spans


def _program_index(spans: list[tuple[int, int, str]]) -> int | None:
    """Which word is the program (the rule of ``program_name``)."""
    for index, (_, _, word) in enumerate(spans):
        if "=" in word.split("/", 1)[0] and not word.startswith(("/", ".")):
            continue
        if word in _PREFIX_WORDS:
            continue
        return index
    return None


def _program_span(line: str) -> tuple[int, int] | None:
    spans = _word_spans(line)
    index = _program_index(spans)
    return None if index is None else spans[index][:2]


def _with_exec_subcommand(line: str) -> str:
    """``codex …`` → ``codex exec …`` unless the line already runs ``exec`` (or its
    alias ``e``), so ``--exec codex`` and ``--exec 'codex exec'`` behave the same.
    Only for the ``codex`` program itself: a wrapper script is taken as written."""
    spans = _word_spans(line)
    index = _program_index(spans)
    if index is None or os.path.basename(spans[index][2]) != "codex":
        return line
    rest = [word for _, _, word in spans[index + 1:]]
    if "exec" in rest or rest[:1] == ["e"]:
        return line
    end = spans[index][1]
    return line[:end] + " exec" + line[end:]
