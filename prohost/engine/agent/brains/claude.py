"""The Claude Code brain: ``claude -p`` with ``--output-format stream-json --verbose``.

The prompt goes to stdin; stdout is one JSON event per line. The shapes read here
are the CLI's own (``system``/``init``, ``assistant``, ``user``, ``result``,
``rate_limit_event``); everything else it prints is skipped, since new event types
and fields appear with every release and none of them may break a run.

What the CLI says about its account's usage limit (``rate_limit_event``, the
synthetic ``rate_limit`` message, a limit-reached result) becomes ``Turn.limit``
(see :mod:`prohost.engine.agent.limits`); a ``rate_limit_event`` some versions wrote into the
middle of another line is split out and the cut line mended.

Two behaviours of the real CLI shape this module:

* A failure still ends with a ``result`` event, and only ``is_error`` / the
  subtype say it failed. A signed-out CLI reports ``"subtype": "success"``,
  ``"is_error": true`` and ``"result": "Invalid API key · Please run /login"``, so
  reading ``result`` alone would post the login prompt to the chat as a reply.
* A ``--resume`` of a session it does not have ends (exit 1, no ``init``) with
  ``{"type":"result","subtype":"error_during_execution","is_error":true,
  "errors":["No conversation found with session ID: <id>"], …}`` and the same
  sentence on stderr; there is no ``result`` text at all.

The one-line summaries of its tool calls come from :mod:`prohost.engine.agent.brains.summaries`.
"""

from __future__ import annotations

import json
import logging
import shlex
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from prohost.engine.accounts.limits import LimitNotice, merge
from prohost.engine.agent.brains.base import (
    MCP_SERVER_NAME,
    Brain,
    McpError,
    McpWiring,
    Turn,
    check_mcp,
    decode_json_line,
    one_line,
    with_limit,
    write_private,
)
from prohost.engine.agent.brains.summaries import activity, tool_summary
from prohost.engine.agent.limits import claude_limit_text, claude_rate_limit, recover_events
from prohost.engine.agent.process import ProcessResult
from prohost.engine.agent.reply import final_reply
from prohost.engine.agent.usage import from_claude_result
from prohost.execline import has_flag, split_command, version_command
from prohost.wire.outcomes import budget_reached, dollars
from prohost.wire.runs import Mcp, Outcome
from prohost.wire.timeline import ToolEvent, ToolState
from prohost.wire.usage import Usage, valid_cost

log = logging.getLogger("prohost.brains.claude")

#: The stable half of the CLI's "No conversation found with session ID: <id>" (the
#: id is interpolated, so the whole sentence is never a constant).
_NO_CONVERSATION = "no conversation found"

#: How much of an error or of the last assistant message goes into a failure.
_ERROR_CHARS = 2000
_QUOTE_CHARS = 300

#: What a subtype means, for a failed result that carries no text of its own.
_SUBTYPE_SENTENCES = {
    "error_max_turns": "Claude Code stopped: it reached its turn limit (--max-turns)",
    "error_during_execution": "Claude Code failed during the run",
    "error_max_structured_output_retries": (
        "Claude Code stopped: it could not produce the requested structured output"
    ),
}


class ClaudeTurn(Turn):
    """One attempt's reading of Claude Code's stream-json output."""

    def __init__(self, clock: Callable[[], float] = time.time, *,
                 max_cost_usd: float | None = None) -> None:
        #: Reads "resets 8pm" relative to now (epoch seconds); a test passes its own.
        self._clock = clock
        #: --max-cost, for the report of a run that reached it.
        self._max_cost_usd = max_cost_usd
        #: The head of a line a ``rate_limit_event`` was written into, waiting for
        #: the rest of that line (see :func:`prohost.engine.agent.limits.recover_events`).
        self._broken: bytes | None = None
        #: Calls still running: id → (name, summary), oldest first.
        self._open: dict[str, tuple[str, str]] = {}
        #: The main agent's last text (a subagent's text is not the reply).
        self.last_text: str | None = None
        #: The final ``result`` event, once seen.
        self.result_event: dict[str, Any] | None = None
        #: The latest ``rate_limit_info`` the CLI reported.
        self.rate_limit: dict[str, Any] | None = None
        #: An assistant event said the API refused the credentials.
        self._auth_failed = False
        self._unnamed = 0

    def feed(self, line: bytes) -> list[ToolEvent]:
        try:
            events: list[ToolEvent] = []
            for event in self._decode(line):
                events.extend(self._read(event))
            return events
        except Exception:
            # A shape nobody foresaw must cost one line of the timeline, not the run.
            log.debug("skipped a Claude Code event that could not be read", exc_info=True)
            return []

    def _decode(self, line: bytes) -> list[dict[str, Any]]:
        """The events of one stdout line, mending a line another event was written into."""
        event = decode_json_line(line)
        broken, self._broken = self._broken, None
        if event is not None:
            return [event]
        if broken is not None:
            # The rest of the line the previous embedded event cut in two.
            mended = decode_json_line(broken + line)
            if mended is not None:
                return [mended]
        head, embedded = recover_events(line, decode_json_line)
        if embedded:
            self._broken = head
        return embedded

    def _read(self, event: dict[str, Any]) -> list[ToolEvent]:
        session_id = event.get("session_id")
        if isinstance(session_id, str) and session_id:
            self.session_id = session_id
        kind = event.get("type")
        if kind == "system":
            if event.get("subtype") == "init":
                self.started = True
                model = event.get("model")
                if isinstance(model, str) and model:
                    self.model = model
        elif kind == "assistant":
            return self._assistant(event)
        elif kind == "user":
            return self._user(event)
        elif kind == "result":
            self.result_event = event
            self.activity = None
        elif kind == "rate_limit_event":
            info = event.get("rate_limit_info")
            if isinstance(info, dict):
                self.rate_limit = info
                self.limit = merge(self.limit, claude_rate_limit(info))
        return []

    def _limit_text(self, text: str, *, anywhere: bool) -> None:
        """Record a limit-reached text; a reset epoch already known from a
        ``rate_limit_event`` is exact, so it beats a time read from "resets 8pm"."""
        notice = claude_limit_text(text, self._clock(), anywhere=anywhere)
        if notice is not None:
            self.limit = merge(notice, self.limit) if self.limit else notice

    def _assistant(self, event: dict[str, Any]) -> list[ToolEvent]:
        error = event.get("error")
        if error == "authentication_failed":
            self._auth_failed = True
        message = event.get("message")
        if not isinstance(message, dict):
            return []
        model = message.get("model")
        # "<synthetic>" marks a message the CLI made up itself (an API error).
        if self.model is None and isinstance(model, str) and model and model != "<synthetic>":
            self.model = model
        content = message.get("content")
        blocks: list[Any] = [{"type": "text", "text": content}] if isinstance(content, str) else (
            content if isinstance(content, list) else []
        )
        texts: list[str] = []
        events: list[ToolEvent] = []
        for block in blocks:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif kind == "tool_use":
                given_id, given_name = block.get("id"), block.get("name")
                if isinstance(given_id, str) and given_id:
                    call_id = given_id
                else:
                    # Its ending cannot be matched, but the call still happened.
                    self._unnamed += 1
                    call_id = f"tool_{self._unnamed}"
                name = given_name if isinstance(given_name, str) and given_name else "tool"
                summary = tool_summary(name, block.get("input"))
                self._open[call_id] = (name, summary)
                self.activity = activity(name, summary)
                events.append(ToolEvent(id=call_id, name=name, state="calling", summary=summary))
        text = "\n".join(part for part in texts if part.strip())
        if error == "rate_limit":
            # The CLI's synthetic message for a refused request ("You've hit your
            # limit · resets 12pm (America/Chicago)", model "<synthetic>",
            # github.com/anthropics/claude-code/issues/40485).
            self._limit_text(text, anywhere=True)
            if self.limit is None or self.limit.state != "limited":
                self.limit = merge(self.limit, LimitNotice(
                    state="limited", source="claude rate_limit error"))
        if text and event.get("parent_tool_use_id") is None:
            self.last_text = text
        return events

    def _user(self, event: dict[str, Any]) -> list[ToolEvent]:
        message = event.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            return []
        events: list[ToolEvent] = []
        for block in content:
            if not isinstance(block, dict) or block.get("type") != "tool_result":
                continue
            call_id = block.get("tool_use_id")
            call = self._open.pop(call_id, None) if isinstance(call_id, str) else None
            if call is None or not isinstance(call_id, str):
                # No "calling" row was posted for it (its line was skipped), so
                # an ending would dangle in the thread.
                continue
            name, summary = call
            state: ToolState = "error" if block.get("is_error") is True else "done"
            events.append(ToolEvent(id=call_id, name=name, state=state, summary=summary))
        if events:
            if self._open:
                name, summary = next(reversed(self._open.values()))
                self.activity = activity(name, summary)
            else:
                self.activity = "thinking"
        return events

    def finish(self, result: ProcessResult) -> Outcome | None:
        event = self.result_event
        if event is not None:
            return self._outcome(event)
        if result.exit_code != 0:
            return None  # the runner names the exit status and the last stderr line
        error = "Claude Code ended without a result"
        if result.overlong_lines:
            error += (
                f" ({result.overlong_lines} output line(s) too long to read were skipped;"
                " the result may have been one of them)"
            )
        if self.last_text:
            error += f'; its last message was: "{one_line(self.last_text, _QUOTE_CHARS)}"'
        return Outcome.failure(error, session_id=self.session_id)

    def _outcome(self, event: dict[str, Any]) -> Outcome:
        subtype = event.get("subtype")
        subtype = subtype if isinstance(subtype, str) else ""
        text = event.get("result")
        text = text if isinstance(text, str) else None
        usage = self.usage().known()
        # An API failure arrives as subtype "success" with is_error true (and its
        # HTTP status in api_error_status); a stopped run has an "error_…" subtype.
        failed = event.get("is_error") is True or subtype.startswith("error")
        if text:
            # A failed result may say it anywhere; a "successful" one only counts
            # when the whole text is the CLI's notice (older builds sent
            # "Claude AI usage limit reached|<epoch>" as the result).
            self._limit_text(text, anywhere=failed)
        if subtype == "error_max_budget_usd":
            # §12: not retryable (it would spend as much again), with its session so
            # the conversation can go on, and what it spent.
            self.reached_budget = True
            error = budget_reached(self._max_cost_usd, None if usage is None else usage.cost_usd)
            return Outcome.failure(error, session_id=self.session_id, usage=usage)
        if failed:
            status = event.get("api_error_status")
            return Outcome.failure(
                self._error(event, subtype, text), session_id=self.session_id, usage=usage,
                # Anthropic's API overloaded or failing: the same request may well
                # go through later (a 429 is a usage limit, handled as such).
                retryable=status in _TRANSIENT_API_STATUSES and self.limit is None,
            )
        # A success without result text (not seen from the CLI, but not ruled out)
        # still has the agent's last words.
        reply = final_reply(text if text is not None else (self.last_text or ""))
        return Outcome(ok=True, reply=reply, session_id=self.session_id, usage=usage)

    def _error(self, event: dict[str, Any], subtype: str, text: str | None) -> str:
        errors = event.get("errors")
        listed = [str(item) for item in errors if item] if isinstance(errors, list) else []
        detail = text.strip() if text and text.strip() else "; ".join(listed)
        sentence = _SUBTYPE_SENTENCES.get(subtype)
        if sentence is None and subtype.startswith("error"):
            sentence = f"Claude Code stopped with {subtype}"
        if not detail:
            error = sentence or "Claude Code reported an error without saying what it was"
        elif self._signed_out(event, detail):
            error = (
                f"Claude Code is not logged in on this machine ({detail}); "
                "run `claude` there, log in with /login, and try again"
            )
        elif sentence and not text:
            error = f"{sentence}: {detail}"
        else:
            error = detail
        return one_line(with_limit(error, self.limit, "Claude"), _ERROR_CHARS)

    def _signed_out(self, event: dict[str, Any], detail: str) -> bool:
        return (
            self._auth_failed
            or event.get("api_error_status") == 401
            or "/login" in detail
        )

    def usage(self) -> Usage:
        # The result event's figures are this invocation's own (not the session's).
        event = self.result_event
        return Usage() if event is None else from_claude_result(event, self.model)

    def resume_rejected(self, result: ProcessResult) -> bool:
        if result.timed_out is not None or result.exit_code == 0:
            return False
        if _NO_CONVERSATION in result.last_stderr_line.lower():
            return True
        event = self.result_event
        if event is not None:
            failed = event.get("is_error") is True or str(event.get("subtype", "")).startswith(
                "error"
            )
            if failed:
                errors = event.get("errors")
                texts = [str(item) for item in errors] if isinstance(errors, list) else []
                if isinstance(event.get("result"), str):
                    texts.append(event["result"])
                if any(_NO_CONVERSATION in item.lower() for item in texts):
                    return True
            # The CLI ran and said how it ended: that is not a rejected resume.
            return False
        # Ended before init: perhaps the session, perhaps a CLI that cannot start at
        # all; the fresh retry tells them apart (execute._session_attempts).
        return not self.started and result.exit_code is not None and result.exit_code != 0


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


#: HTTP statuses of Anthropic's API that say "not now" rather than "never": a run
#: that failed with one is reported retryable.
_TRANSIENT_API_STATUSES = frozenset({500, 502, 503, 504, 529})


class ClaudeBrain(Brain):
    """Claude Code in print mode, read as a stream of JSON events."""

    name = "claude"
    streams = True
    bounds_cost = True

    def command(self, *, session_id: str | None, mcp: McpWiring | None,
                max_cost_usd: float | None = None) -> str:
        # The user's line is kept byte for byte and only appended to: reparsing and
        # re-quoting it could change what their shell words mean.
        line = self.exec_line
        extra: list[str] = []
        if not has_flag(line, "-p", "--print"):
            # Without print mode the CLI starts its interactive UI, which cannot
            # run without a terminal.
            extra.append("-p")
        if not has_flag(line, "--output-format"):
            extra += ["--output-format", "stream-json"]
        if not has_flag(line, "--verbose"):
            # Print mode refuses stream-json without --verbose.
            extra.append("--verbose")
        if not (
            self.safe_tools
            or has_flag(line, "--dangerously-skip-permissions", "--permission-mode")
        ):
            # Nobody is at a terminal to approve a tool call, so a permission
            # prompt would just deny it; a user who chose a mode keeps theirs.
            extra.append("--dangerously-skip-permissions")
        budget = self.max_cost_usd if max_cost_usd is None else max_cost_usd
        users = self._users_budget()
        if budget is not None and (not has_flag(line, "--max-budget-usd")
                                   or (users is not None and budget < users)):
            # Claude Code stops the run there (result subtype error_max_budget_usd).
            # Each attempt is a new process that counts from zero, so after a
            # fail-over it gets what is left of the run's budget (§12), the user's
            # own --max-budget-usd included: appended after theirs, which it
            # overrides (commander.js keeps an option's last value).
            extra.append(f"--max-budget-usd={dollars(budget)}")
        if session_id is not None:
            extra.append(f"--resume={shlex.quote(session_id)}")
        words = " ".join(extra)
        if mcp is not None and mcp.args:
            # Last, because --mcp-config takes every following word up to the next
            # flag as another config file.
            words += " " + shlex.join(mcp.args)
        return f"{line} {words}".rstrip() if words else line

    def new_turn(self) -> ClaudeTurn:
        return ClaudeTurn(max_cost_usd=self.budget_in_force())

    def budget_in_force(self) -> float | None:
        # A --max-budget-usd of the user's own stays on the line, so that is the
        # run's budget (command() adds one only for what is left of it).
        users = self._users_budget()
        return self.max_cost_usd if users is None else users

    def _users_budget(self) -> float | None:
        """The amount of a ``--max-budget-usd`` in the user's own ``--exec`` line."""
        words = split_command(self.exec_line)
        for index, word in enumerate(words):
            value = None
            if word == "--max-budget-usd" and index + 1 < len(words):
                value = words[index + 1]
            elif word.startswith("--max-budget-usd="):
                value = word.split("=", 1)[1]
            if value is not None:
                return valid_cost(_number(value))
        return None

    def version_command(self) -> str | None:
        return version_command(self.exec_line)

    def wire_mcp(self, mcp: Mcp, folder: Path,
                 env: Mapping[str, str] | None = None) -> McpWiring:
        check_mcp(mcp)
        server: dict[str, Any] = {"type": "http", "url": mcp.url}
        if mcp.token:
            server["headers"] = {"Authorization": f"Bearer {mcp.token}"}
        config = {"mcpServers": {MCP_SERVER_NAME: server}}
        path = folder / "mcp.json"
        try:
            write_private(path, json.dumps(config, indent=2) + "\n")
        except OSError as exc:
            raise McpError(f"could not write {path}: {exc.strerror or exc}") from None
        args: tuple[str, ...] = ("--mcp-config", str(path))
        if self.safe_tools:
            # With permission prompts on, print mode denies every tool nobody
            # pre-approved; the run's own server is the one the request came with.
            args = (f"--allowedTools=mcp__{MCP_SERVER_NAME}", *args)
        return McpWiring(args=args)
