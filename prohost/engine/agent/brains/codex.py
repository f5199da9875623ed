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
becomes ``Turn.limit`` (see :mod:`prohost.engine.agent.limits`). The reply is the text of the
last completed ``agent_message`` item, which is what ``codex exec`` itself
writes for ``--output-last-message``.

A turn that does not complete prints no usage; the thread's running totals are
then read from Codex's session rollout file (:meth:`CodexBrain.recorded_totals`,
called by the runner after the attempt).

A run's MCP token reaches Codex through a private overlay of its CODEX_HOME
(:mod:`prohost.engine.agent.brains.codex_home`); the one-line summaries of its items
come from :mod:`prohost.engine.agent.brains.summaries`.
"""

from __future__ import annotations

import logging
import os
import shlex
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from prohost.engine.accounts.limits import merge
from prohost.engine.agent.brains.base import (
    MCP_SERVER_NAME,
    Brain,
    McpWiring,
    Turn,
    check_mcp,
    decode_json_line,
    with_limit,
)
from prohost.engine.agent.brains.codex_home import (
    CODEX_HOME_ENV,
    codex_home,
    codex_overlay,
    rollout_totals,
    toml_string,
)
from prohost.engine.agent.brains.summaries import CODEX_TOOL_NAMES, activity, item_summary
from prohost.engine.agent.limits import codex_limit_text, codex_rate_limits
from prohost.engine.agent.process import ProcessResult
from prohost.engine.agent.reply import final_reply
from prohost.engine.agent.usage import from_codex_totals
from prohost.engine.sandbox import defaults
from prohost.execline import (
    has_flag,
    program_index,
    split_command,
    version_command,
    word_spans,
)
from prohost.wire.runs import Mcp, Outcome
from prohost.wire.timeline import ToolEvent, ToolState
from prohost.wire.usage import Usage

log = logging.getLogger("prohost.brains.codex")

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

#: Item statuses that mean the tool did not do what was asked. ``declined`` is a
#: command the sandbox or policy refused to run.
_FAILED_STATUSES = frozenset({"failed", "declined"})


class CodexTurn(Turn):
    """Reads one ``codex exec --json`` attempt."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        #: Reads "Try again at 2:57 PM" relative to now (epoch s); tests pass their own.
        self._clock = clock
        self.reply: str | None = None
        #: The thread's running totals from ``turn.completed`` (openai/codex
        #: ``usage_from_last_total``, issue #17539): the session's, not the run's.
        self.totals: Usage | None = None
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
                self.totals = from_codex_totals(usage, self.model)
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
        if (not isinstance(item_type, str) or item_type not in CODEX_TOOL_NAMES
                or kind == "item.updated"):
            # reasoning, todo_list, error (non-fatal notices), plan, collab calls
            # and types a later Codex adds: nothing to show on the timeline.
            return []
        name = CODEX_TOOL_NAMES[item_type]
        item_id = item.get("id")
        if isinstance(item_id, str) and item_id:
            tool_id = item_id
        else:
            self._unnamed += 1
            tool_id = f"{item_type}-{self._unnamed}"
        summary = item_summary(item_type, item)
        state: ToolState
        if kind == "item.started":
            state = "calling"
            self._open[tool_id] = activity(name, summary)
        else:
            state = "error" if _failed(item) else "done"
            self._open.pop(tool_id, None)
        # What runs now is the latest tool still open; between tools the model is
        # at work (the wording the Claude brain uses too).
        self.activity = next(reversed(self._open.values()), "thinking")
        return [ToolEvent(id=tool_id, name=name, state=state, summary=summary)]

    def usage(self) -> Usage:
        # This run's share of the thread's totals: what they reached less what the
        # resumed thread had before (§7); one `codex exec` is one turn.
        if self.totals is None:
            return Usage()
        # A turn in between that failed reported nothing: its tokens are in this
        # difference, and the report says so (§7).
        earlier = True if self.usage_before.includes_earlier_turns else None
        return attrs.evolve(self.totals.since(self.usage_before), turns=1,
                            includes_earlier_turns=earlier)

    def session_totals(self) -> Usage | None:
        return self.totals

    def finish(self, result: ProcessResult) -> Outcome | None:
        if self.turn_failed is not None:
            # Codex discards the turn's last message when the turn fails, and so
            # does this: a partial answer is not the reply.
            return Outcome.failure(self._with_limit(self.turn_failed),
                                   session_id=self.session_id)
        if self.reply is not None:
            if result.exit_code == 0:
                return Outcome(ok=True, reply=final_reply(self.reply), session_id=self.session_id,
                               usage=self.usage().known())
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
        return with_limit(error, self.limit, "Codex")

    def resume_rejected(self, result: ProcessResult) -> bool:
        if result.exit_code is None or result.exit_code == 0:
            return False
        if not self.started:
            # Codex resolves the thread before it announces it: failing before
            # thread.started is failing to resume (an unknown id, an unreadable
            # rollout); a fresh thread is the way on. Or codex cannot start at all
            # (a refused flag, not installed): then the fresh one fails alike and
            # the run keeps the thread (prohost.engine.run.execute._session_attempts).
            return True
        said = [result.last_stderr_line, self.last_error or "", self.turn_failed or ""]
        return any(marker in text.lower() for text in said for marker in _UNKNOWN_THREAD_MARKERS)


class CodexBrain(Brain):
    name = "codex"
    streams = True

    def command(self, *, session_id: str | None, mcp: McpWiring | None,
                max_cost_usd: float | None = None) -> str:
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

    running_totals = True

    def recorded_totals(self, session_id: str, env: Mapping[str, str]) -> Usage | None:
        """The thread's running totals as Codex last recorded them in its session
        rollout file, in the CODEX_HOME ``env`` names (the account's: a run's overlay
        links to its ``sessions``), for a turn that printed no ``turn.completed``
        (failed, timed out, stopped): ``None`` when the file or a token count in it
        is missing. Raises :class:`OSError` when it cannot be read. Blocking file I/O
        (its tail only): call it in a worker thread."""
        return rollout_totals(codex_home(env), session_id)

    def new_turn(self) -> Turn:
        return CodexTurn()

    def version_command(self) -> str | None:
        return version_command(self.exec_line)

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
        could read it (see :mod:`prohost.engine.agent.brains.codex_home`): ``folder``
        gets an overlay of the account's CODEX_HOME (``env``'s ``CODEX_HOME``,
        else ``~/.codex``) whose ``config.toml`` adds the run's server with its
        header, and the agent gets ``CODEX_HOME`` pointing at the overlay.
        """
        check_mcp(mcp, transport="Codex reaches MCP servers over streamable HTTP")
        prefix = f"mcp_servers.{MCP_SERVER_NAME}"
        args = (
            # Codex 0.4x only spoke streamable HTTP through the then-experimental
            # rmcp client; later builds made it the default and ignore the key.
            "-c", "experimental_use_rmcp_client=true",
            "-c", f"{prefix}.url={toml_string(mcp.url)}",
        )
        if not mcp.token:
            return McpWiring(args=args)
        env = os.environ if env is None else env
        user_home = Path(env.get("HOME") or Path.home())
        # Never copied from a secret store, nor through a link (issue 36, attack 7).
        overlay = codex_overlay(codex_home(env), folder, mcp.url, mcp.token,
                                hidden=defaults.secrets(user_home))
        return McpWiring(args=args, env={CODEX_HOME_ENV: str(overlay)})


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


def _with_exec_subcommand(line: str) -> str:
    """``codex …`` → ``codex exec …`` unless the line already runs ``exec`` (or its
    alias ``e``), so ``--exec codex`` and ``--exec 'codex exec'`` behave the same.
    Only for the ``codex`` program itself: a wrapper script is taken as written."""
    spans = word_spans(line)
    index = program_index([word for _, _, word in spans])
    if index is None or os.path.basename(spans[index][2]) != "codex":
        return line
    rest = [word for _, _, word in spans[index + 1:]]
    if "exec" in rest or rest[:1] == ["e"]:
        return line
    end = spans[index][1]
    return line[:end] + " exec" + line[end:]
