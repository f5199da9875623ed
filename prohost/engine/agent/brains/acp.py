"""The ACP brain: any agent that speaks the Agent Client Protocol v1 on its stdio.

Gemini CLI (``gemini --acp``), Qwen Code, Copilot CLI, OpenCode, Goose, Cursor, and
Claude Code and Codex through their adapters speak ACP (the protocol:
agentclientprotocol/agent-client-protocol, ``docs/protocol/v1``,
``schema/v1/schema.json``). Each attempt is one agent process and one
conversation over its stdin and stdout, JSON-RPC 2.0 one message per line
(:mod:`prohost.engine.agent.brains.acp_rpc`)::

    → initialize {protocolVersion: 1, clientCapabilities: {fs: none, terminal: false}}
    ← {protocolVersion: 1, agentCapabilities: {loadSession, sessionCapabilities.resume…}}
    → session/resume | session/load {sessionId, cwd, mcpServers}   (the lane's session)
      or session/new {cwd, mcpServers}     (mcpServers: the run's MCP server, over HTTP)
    → session/prompt {sessionId, prompt: [{type: text, text: <the harness's prompt>}]}
    ← session/update … (agent_message_chunk, tool_call, usage_update…)
    ← session/request_permission → answered at once
    ← {stopReason: end_turn | max_tokens | max_turn_requests | refusal | cancelled}
    → session/close (where offered), then stdin is closed and the agent exits
      (within LINGER_S, or 0.5 s once it answered session/close, else it is stopped).

The lane's session is resumed (``session/resume``) or, when the agent offers only
that, loaded (``session/load``, which replays the history: none of it is the reply);
when it offers neither, or rejects the session, a new one is started in the same
process, inside the same deadline (§5.5). A stop of the run (cancel, ``--timeout``,
``--idle-timeout``, the second signal) first sends ``session/cancel`` and waits a
little for the prompt to return (:class:`~prohost.engine.agent.launch.Conversation`).

Design choices, in DESIGN terms:

* **Dependency: none.** The official Python SDK (``agent-client-protocol``,
  ``import acp``) runs on asyncio and validates with pydantic. This program is
  trio with attrs/cattrs and watches every agent from one task without threads
  (:mod:`prohost.engine.agent.process`); the SDK would need trio-asyncio or a
  thread with its own loop per run, a second model layer beside attrs, and its own
  subprocess spawn, bypassing the one spawn that puts every agent in its process
  group and confinement (§13). The part of ACP a headless client uses is six
  methods and a handful of update kinds; a small synchronous JSON-RPC reader fed
  line by line, with attrs types for the messages, is less code than the glue
  and keeps the "one task, bounded memory, never raise on input" rules.
* **fs and terminal: not offered.** ``fs/read_text_file``/``fs/write_text_file``
  and ``terminal/*`` would be done by the harness's own process, outside the
  agent's sandbox (§13) and process group, so the harness would have to re-check
  every path and command against the confinement. Declining them costs nothing:
  every ACP agent has its own file and shell tools (they run confined, as the
  agent does), and the protocol requires agents to work without them.
* **Permissions** are answered at once: nobody is at a terminal
  (:func:`~prohost.engine.agent.brains.acp_choices.permission_option`); after
  ``session/cancel``, ``cancelled``, as ACP requires.
* **Logging in**: only when the agent asks (-32000) and offers a key its
  environment holds (:mod:`~prohost.engine.agent.brains.acp_auth`).
* **Cost**: ``usage_update.cost`` is the session's running total; the run's share
  is this turn's last total less the previous turn's (kept in the ledger with the
  session, as Codex's totals are: ``running_totals``); for an agent known to count
  it from its own start instead (the Claude Code adapter), all of it.
"""

from __future__ import annotations

import enum
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from prohost import __version__
from prohost.engine.accounts.limits import merge
from prohost.engine.agent.brains import acp_rpc as rpc
from prohost.engine.agent.brains.acp_auth import key_names, method_for
from prohost.engine.agent.brains.acp_choices import (
    SETTERS,
    ChoiceError,
    choices,
    chosen,
    chosen_value,
    permission_option,
    session_mode,
)
from prohost.engine.agent.brains.acp_limits import acp_limit_text
from prohost.engine.agent.brains.acp_reply import ReplyText
from prohost.engine.agent.brains.acp_tools import ToolCalls
from prohost.engine.agent.brains.acp_usage import TurnTokens, session_model
from prohost.engine.agent.brains.base import (
    McpWiring,
    Turn,
    one_line,
    with_limit,
)
from prohost.engine.agent.launch import Conversation, StdinPipe
from prohost.engine.agent.process import ProcessResult
from prohost.engine.agent.reply import final_reply
from prohost.wire.outcomes import (
    ACP_NO_ANSWER,
    ACP_NO_HTTP_MCP,
    acp_no_reply,
    acp_refusal_ended,
    acp_signed_out,
    acp_stopped,
    acp_version,
)
from prohost.wire.runs import Outcome
from prohost.wire.timeline import ToolEvent
from prohost.wire.usage import Usage, valid_cost

log = logging.getLogger("prohost.brains.acp")

PROTOCOL_VERSION = 1

#: How long an error text may be in a failure (characters).
_ERROR_CHARS = 2000

#: Agents whose ``usage_update.cost`` counts from their own start, not over the
#: session's life: the Claude Code adapter sends the Claude Agent SDK's
#: ``total_cost_usd``, which a new process (a loaded session) starts at 0 again
#: (``acp-agent.js`` of @agentclientprotocol/claude-agent-acp 0.101). Their whole
#: total is the run's; the session's earlier turns are no part of it.
_COST_SINCE_START = frozenset({
    "@agentclientprotocol/claude-agent-acp",
    "@zed-industries/claude-agent-acp",
    "@zed-industries/claude-code-acp",
})

_SETUP = ("session/new", "session/load", "session/resume")
#: The round trip that drains a session/load's replay (see ``_opened``).
_SYNC = "_prohost/sync"

#: How long an agent that answered ``session/close`` has to exit by itself before
#: it is stopped (the others get :data:`~prohost.engine.agent.launch.LINGER_S`).
_AFTER_CLOSE_S = 0.5

#: How long each step before the prompt (initialize, logging in, the session's
#: setup, its model and mode, a load's replay) may take before the agent is
#: stopped: --idle-timeout (15 min by default) is no bound for a start that hangs.
#: Long enough for ``npx -y`` fetching an adapter the first time.
SETUP_S = 180.0

class _Phase(enum.Enum):
    STARTING = "initialize"
    OPENING = "session setup"
    DRAINING = "session replay"
    PROMPTING = "prompt"
    DONE = "done"


class AcpTurn(Turn):
    """One attempt's conversation with an ACP agent, and its reading."""

    def __init__(self, *, safe_tools: bool = False,
                 choose: Callable[[Mapping[str, str]], tuple[str | None, str | None]] | None
                 = None, clock: Callable[[], float] = time.time) -> None:
        self._safe_tools = safe_tools
        #: --acp-model and --acp-mode for the attempt's account: set once the
        #: session is open (known with the agent's environment).
        self._choose = choose
        self._want_model: str | None = None
        self._want_mode: str | None = None
        #: The choices still to make (method, params) before the prompt.
        self._to_set: list[tuple[str, dict[str, Any]]] = []
        self._loaded = False
        #: The session's mode, once known.
        self.mode: str | None = None
        #: The step before the prompt being waited for (bounded by SETUP_S).
        self._setup_step: str | None = None
        self._clock = clock
        self._stdin: StdinPipe | None = None
        self._prompt = ""
        self._cwd = ""
        self._resume: str | None = None
        self._env: Mapping[str, str] = os.environ
        #: The run's MCP servers, as ACP ``McpServer`` objects.
        self._servers: list[dict[str, Any]] = []
        self._next_id = 0
        #: Our requests not yet answered: id → (method, params).
        self._pending: dict[rpc.MessageId, tuple[str, dict[str, Any]]] = {}
        #: The agent's ``authMethods`` (initialize).
        self._auth_methods: list[dict[str, Any]] = []
        #: The setup request an ``authenticate`` is for (asked again once it is).
        self._after_auth: tuple[str, dict[str, Any]] | None = None
        self._authenticated = False
        #: Timeline rows made outside an update (notices), given by the next feed.
        self._events: list[ToolEvent] = []
        self._notices = 0
        #: Why the lane's session was not taken back (then this turn is a new one).
        self.renewed: str | None = None
        #: The tools ``--safe-tools`` refused, and whether a refusal ends the turn.
        self._refused_tools: list[str] = []
        self._refusal_ends = False
        self._phase = _Phase.STARTING
        self._capabilities: dict[str, Any] = {}
        #: The session to prompt, once open (also ``session_id`` then).
        self._session: str | None = None
        #: The load or resume was refused: the new session's cost counts from 0.
        self._fresh = False
        #: The agent's cost counts from its own start (:data:`_COST_SINCE_START`).
        self._fresh_cost = False
        self._reply = ReplyText()
        self.stop_reason: str | None = None
        #: A failure the agent answered with (a JSON-RPC error, a wrong version).
        self.error: str | None = None
        self._cancel_sent = False
        #: The session's running cost total (USD) as last reported this turn.
        self._cost_total: float | None = None
        self._tokens = TurnTokens()
        self._tools = ToolCalls()
        #: Lines that were not JSON-RPC messages (an agent logging on stdout).
        self.garbage = 0

    # ---------------------------------------------------------------- Conversation

    def conversation(self, prompt: str, session_id: str | None, cwd: Path,
                     mcp: McpWiring | None = None,
                     env: Mapping[str, str] | None = None) -> Conversation:
        self._prompt = prompt
        if env is not None:
            self._env = env
        if self._choose is not None:
            self._want_model, self._want_mode = self._choose(self._env)
        self._cwd = os.path.abspath(cwd)
        self._servers = [dict(server) for server in mcp.servers] if mcp is not None else []
        self._resume = session_id or None
        return self

    def open(self, stdin: StdinPipe) -> None:
        self._stdin = stdin
        self._send("initialize", {
            "protocolVersion": PROTOCOL_VERSION,
            "clientCapabilities": {
                "fs": {"readTextFile": False, "writeTextFile": False},
                "terminal": False,
            },
            "clientInfo": {"name": "prohost", "title": "prohost", "version": __version__},
        })

    def interrupt(self) -> bool:
        if self._phase is not _Phase.PROMPTING or self._session is None or self._cancel_sent:
            return False
        self._cancel_sent = True
        self._write(rpc.notification("session/cancel", {"sessionId": self._session}))
        return True

    def settled(self) -> bool:
        """The prompt was answered (or the conversation failed): nothing is pending."""
        return self._phase is _Phase.DONE

    # ---------------------------------------------------------------- reading

    def feed(self, line: bytes) -> list[ToolEvent]:
        events: list[ToolEvent] = []
        try:
            message = rpc.read_message(line)
            if message is None:
                if line.strip():
                    self.garbage += 1
            elif isinstance(message, rpc.Response):
                self._response(message)
            elif isinstance(message, rpc.Request):
                events = self._request(message)
            elif message.method == "session/update":
                events = self._update(message.params)
        except Exception:
            # A shape no agent was seen to send costs that message, not the run.
            log.debug("skipped an ACP message it could not read", exc_info=True)
        if self._events:
            events, self._events = self._events + events, []
        return events

    def overlong(self, head: bytes) -> None:
        """A stdout line over the reader's bound (8 MiB) was skipped; ``head`` is its
        start (:class:`~prohost.engine.agent.output.LineSplitter`). A request in it
        still waits for an answer: the Claude Code adapter's edit permissions carry
        whole files, its ``options`` first (``{"jsonrpc","id","method","params":
        {"options":[…],"sessionId","toolCall":{…}}}``, claude-agent-acp 0.49). A
        permission whose options are in the head is answered as any other; any other
        request gets an error, so that the agent never waits for nothing."""
        try:
            found = rpc.read_head(head)
            if found is None:
                return  # a notification or a response: nothing waits for an answer
            message_id, method, options = found
            if options is not None and method == "session/request_permission":
                self._write(rpc.result(message_id, {"outcome": self._permission(
                    {"options": options, "toolCall": {"title": "(a request over 8 MiB)"}})}))
                return
            self._write(rpc.error(message_id, rpc.INTERNAL_ERROR,
                                  f"prohost could not read this {method} request: it is "
                                  "over 8 MiB on one line"))
            self._notice(f"the agent sent a {method} request over 8 MiB; it was refused")
        except Exception:
            log.debug("could not read the start of an over-long line", exc_info=True)

    def _notice(self, text: str) -> None:
        """Something the person should know that is not the agent's reply: the
        log and the timeline (§8), never the reply."""
        log.warning("%s", text)
        self._notices += 1
        self._events.append(ToolEvent(id=f"prohost-notice-{self._notices}", name="Notice",
                                      state="done", summary=one_line(text, 300)))

    def _response(self, message: rpc.Response) -> None:
        asked = self._pending.pop(message.id, None)
        if asked is None:
            return  # not ours, or answered twice
        method, params = asked
        if method == _SYNC:
            self._prompting()  # the replay is over, whatever the answer
            return
        if method in SETTERS and message.error is None:
            self.model, self.mode = chosen(params, self.model, self.mode)
            self._next_choice()
            return
        if method == "session/close":
            if self._stdin is not None:
                self._stdin.close(_AFTER_CLOSE_S)  # answered, or refused: done either way
            return
        if message.error is not None:
            self._refused(method, params, message.error)
            return
        answer = message.result if isinstance(message.result, dict) else {}
        if method == "authenticate":
            self._authenticated = True
            if self._after_auth is not None:
                self._send(*self._after_auth)  # the setup it was for, again
            return
        if method == "initialize":
            version = answer.get("protocolVersion")
            if version != PROTOCOL_VERSION:
                self._fail(acp_version(version))
                return
            capabilities = answer.get("agentCapabilities")
            self._capabilities = capabilities if isinstance(capabilities, dict) else {}
            info = answer.get("agentInfo")
            if isinstance(info, dict) and isinstance(info.get("name"), str):
                self._tokens.agent = info["name"]
                self._fresh_cost = info["name"] in _COST_SINCE_START
            methods = answer.get("authMethods")
            self._auth_methods = [m for m in methods if isinstance(m, dict)] if isinstance(
                methods, list) else []
            mcp = self._capabilities.get("mcpCapabilities")
            if self._servers and not (isinstance(mcp, dict) and mcp.get("http") is True):
                # Fail closed, as every brain does with an MCP server it cannot wire.
                self._fail(ACP_NO_HTTP_MCP)
                return
            self._open_session()
        elif method == "session/new":
            session = answer.get("sessionId")
            if not isinstance(session, str) or not session:
                self._fail("the agent answered session/new without a session id")
                return
            self._opened(session, answer)
        elif method in ("session/load", "session/resume"):
            # session/load's result is null in the v1 docs and an object in the
            # schema: both are a loaded session.
            self._opened(self._resume or "", answer, loaded=method == "session/load")
        elif method == "session/prompt":
            reason = answer.get("stopReason")
            # Required by the schema; an answer without one still ended the turn.
            self.stop_reason = reason if isinstance(reason, str) else "end_turn"
            self._tokens.answer(answer.get("usage"), answer.get("_meta"))
            for text in [*self._reply.loose(), *self._reply.notices]:
                self._notice(f"the agent said (not part of its reply): {text}")
            self._end()

    def _refused(self, method: str, params: dict[str, Any], error: rpc.RpcError) -> None:
        text = error.text()
        self.last_error = text
        self._limit(text)
        if method == "authenticate":
            self._fail(acp_signed_out(text))
            return
        if method in SETTERS:
            self._fail(f"the agent refused {SETTERS[method]} {chosen_value(params)!r}: {text}")
            return
        if method == "session/prompt" and self._cancel_sent:
            # The cancel we asked for, answered with an error instead of the
            # stopReason "cancelled" (Qwen Code 0.15 answers -32603): a cancel.
            self.stop_reason = "cancelled"
            self._end()
            return
        if error.code == rpc.AUTH_REQUIRED and method in _SETUP and self._authenticate(
                method, params):
            return  # logged in with a key from its environment; then asked again
        if (method == "session/resume" and error.code == rpc.METHOD_NOT_FOUND
                and self._capabilities.get("loadSession") is True):
            # Offered but not there (Qwen Code 0.15 announces resume and answers
            # "Method not found"): that says nothing of the session; load it.
            self._send("session/load", {"sessionId": self._resume, "cwd": self._cwd,
                                        "mcpServers": self._servers})
            return
        limited = self.limit is not None and self.limit.state == "limited"
        if method in ("session/load", "session/resume") and not self._fresh and not limited:
            # The agent would not take the lane's session back, for whatever reason
            # (gone, or "Authentication required" from Gemini CLI, which starts new
            # sessions with a key alone but loads none without a saved login): a
            # new one, once, in this same process and deadline (§5.5). Ending the
            # run here would leave the conversation on a session no turn can open.
            self.renewed = (f"the agent could not take back the conversation's session "
                            f"{self._resume} ({text}); this turn starts a new session")
            self._notice(self.renewed)
            self._fresh = True
            self._phase = _Phase.OPENING
            self._send("session/new", {"cwd": self._cwd, "mcpServers": self._servers})
            return
        if error.code == rpc.AUTH_REQUIRED:
            self._fail(acp_signed_out(text, key_names(self._auth_methods)))
            return
        self._fail(f"the agent failed {method}: {text}")

    def _authenticate(self, method: str, params: dict[str, Any]) -> bool:
        """Log in with the first auth method whose keys the agent's environment
        holds (an ``env_var`` method: codex-acp's "openai-api-key" reads
        ``OPENAI_API_KEY`` only once told to), then ask ``method`` again; once per
        turn. ``False``: no method the environment satisfies."""
        if self._authenticated or self._after_auth is not None:
            return False
        method_id = method_for(self._auth_methods, self._env)
        if method_id is None:
            return False
        self._after_auth = (method, params)
        self._send("authenticate", {"methodId": method_id})
        return True

    def _open_session(self) -> None:
        self._phase = _Phase.OPENING
        sessions = self._capabilities.get("sessionCapabilities")
        if self._resume is not None:
            params = {"sessionId": self._resume, "cwd": self._cwd, "mcpServers": self._servers}
            # Resume first: it takes the session back without replaying its whole
            # history over stdout, all of which a load's reader would only skip.
            if isinstance(sessions, dict) and isinstance(sessions.get("resume"), dict):
                self._send("session/resume", params)
                return
            if self._capabilities.get("loadSession") is True:
                self._send("session/load", params)
                return
            self._fresh = True  # it can take no session back: a new one
        self._send("session/new", {"cwd": self._cwd, "mcpServers": self._servers})

    def _opened(self, session: str, answer: dict[str, Any], *, loaded: bool = False) -> None:
        self._session = self.session_id = session
        self.started = True
        self.model = session_model(answer) or self.model
        self.mode = session_mode(answer) or self.mode
        self._loaded = loaded
        try:
            self._to_set = choices(answer, session, model=self._want_model,
                                   mode=self._want_mode, safe_tools=self._safe_tools)
        except ChoiceError as exc:
            self._fail(str(exc))
            return
        self._next_choice()

    def _next_choice(self) -> None:
        """The next model or mode to set, else the prompt (a load's replay first)."""
        if self._to_set:
            self._send(*self._to_set.pop(0))
            return
        if self._loaded:
            # Gemini CLI replays a loaded session's history *after* its answer
            # (``loadSession`` calls ``session.streamHistory`` without awaiting it,
            # @google/gemini-cli 0.61's bundle): a round trip first, answered only
            # once what was queued before it is out, and the prompt after it. An
            # extension method (ACP: "_" names) every agent answers, if only with
            # "Method not found".
            self._phase = _Phase.DRAINING
            self._send(_SYNC, {})
            return
        self._prompting()

    def _prompting(self) -> None:
        session = self._session
        self._phase = _Phase.PROMPTING
        self.activity = "thinking"
        self._send("session/prompt", {
            "sessionId": session,
            "prompt": [{"type": "text", "text": self._prompt}],
        })

    def _request(self, message: rpc.Request) -> list[ToolEvent]:
        if message.method == "session/request_permission":
            self._write(rpc.result(message.id, {"outcome": self._permission(message.params)}))
            call = message.params.get("toolCall")
            # The call asked about may not have been announced yet (Gemini CLI
            # announces such a call only here): it is on the timeline from now.
            return self._tool_events(self._tools.update, call) if isinstance(
                call, dict) else []
        # fs/* and terminal/* were not offered (see the module's notes); anything
        # else is unknown here. An answer keeps the agent from waiting for one.
        self._write(rpc.error(message.id, rpc.METHOD_NOT_FOUND,
                              f"prohost does not offer {message.method}"))
        return []

    def _permission(self, params: dict[str, Any]) -> dict[str, Any]:
        """The answer to ``session/request_permission``: the agent's allow option
        (with ``--safe-tools``, a refusal that lets the turn go on, else one that
        ends it); ``cancelled`` once the turn is being cancelled, as ACP requires
        (``docs/protocol/v1/prompt-turn.mdx``, Cancellation), or when no option fits."""
        options = params.get("options")
        if self._cancel_sent or not isinstance(options, list):
            return {"outcome": "cancelled"}
        option_id, ends = permission_option(options, safe_tools=self._safe_tools)
        if option_id is None:
            return {"outcome": "cancelled"}
        if self._safe_tools:
            call = params.get("toolCall")
            title = call.get("title") if isinstance(call, dict) else None
            self._refused_tools.append(one_line(title) if isinstance(title, str)
                                       and title.strip() else "a tool call")
            self._refusal_ends = self._refusal_ends or ends
        return {"outcome": "selected", "optionId": option_id}

    def _update(self, params: dict[str, Any]) -> list[ToolEvent]:
        if self._phase is not _Phase.PROMPTING:
            # A session/load replays the whole history first: none of it is this
            # turn's (not its reply, tools, or cost).
            return []
        update = params.get("update")
        if not isinstance(update, dict):
            return []
        kind = update.get("sessionUpdate")
        if kind == "agent_message_chunk":
            self._chunk(update)
        elif kind == "agent_thought_chunk":
            self.activity = self._tools.activity()  # the latest open tool, else thinking
        elif kind == "tool_call":
            return self._tool_events(self._tools.call, update)
        elif kind == "tool_call_update":
            return self._tool_events(self._tools.update, update)
        elif kind == "usage_update":
            cost = update.get("cost")
            if isinstance(cost, dict) and str(cost.get("currency", "")).upper() == "USD":
                amount = valid_cost(cost.get("amount"))
                if amount is not None:
                    self._cost_total = amount
        return []

    def _chunk(self, update: dict[str, Any]) -> None:
        self._tokens.call(update.get("_meta"))  # Qwen Code's per-call usage
        content = update.get("content")
        if not isinstance(content, dict) or content.get("type") != "text":
            return
        text = content.get("text")
        if isinstance(text, str):
            self._reply.add(text, update.get("messageId"))

    def _tool_events(self, read: Callable[[dict[str, Any]], list[ToolEvent]],
                     update: dict[str, Any]) -> list[ToolEvent]:
        before = self._tools.announced
        events = read(update)
        if self._tools.announced > before:
            self._reply.paragraph()  # text after a tool call is a new paragraph
            self._tokens.tool_called = True
        self.activity = self._tools.activity()
        return events

    def _limit(self, text: str) -> None:
        notice = acp_limit_text(text, self._clock())
        if notice is not None:
            self.limit = merge(self.limit, notice)

    # ---------------------------------------------------------------- writing

    def _send(self, method: str, params: dict[str, Any]) -> None:
        message_id = self._next_id
        self._next_id += 1
        self._pending[message_id] = (method, params)
        self._write(rpc.request(message_id, method, params))
        if self._stdin is not None and self._phase is not _Phase.DONE:
            # Each step before the prompt has SETUP_S; the prompt has the run's limits.
            prompting = self._phase is _Phase.PROMPTING
            self._setup_step = None if prompting else method
            self._stdin.close(math.inf if prompting else SETUP_S, eof=False)

    def _write(self, data: bytes) -> None:
        if self._stdin is not None:
            self._stdin.write(data)

    def _fail(self, error: str) -> None:
        self.error = error
        self._end()

    def _end(self) -> None:
        """The conversation is over: end-of-file, and the agent exits. A tool call
        still open will never end now (a cancel, a turn that ended without saying):
        it is marked ended with an error, not left "calling" on the timeline."""
        opened = self._phase is _Phase.PROMPTING
        if opened or self.error is not None:
            log.info("the agent's turn in session %s ended: %s", self._session,
                     self.stop_reason or self.error)
        self._phase = _Phase.DONE
        self.activity = None
        self._events += self._tools.close_all()
        sessions = self._capabilities.get("sessionCapabilities")
        if opened and isinstance(sessions, dict) and isinstance(sessions.get("close"), dict):
            # Said goodbye properly: the agent lets the session go (its state kept),
            # and once it has answered it is stopped at once (codex-acp does not
            # exit at end-of-file, so each run would wait the whole linger).
            self._send("session/close", {"sessionId": self._session})
        if self._stdin is not None:
            self._stdin.close()

    # ---------------------------------------------------------------- the outcome

    def usage(self) -> Usage:
        """What this turn used as far as the agent said, whenever it ended: a
        cancelled or timed-out turn keeps the cost and tokens streamed before."""
        cost = None
        earlier = None
        if self._cost_total is not None:
            if self._fresh or self._fresh_cost or self._resume is None:
                cost = self._cost_total  # counted from this session's (or process's) start
            else:
                before = self.usage_before.cost_usd
                if before is None or self.usage_before.includes_earlier_turns:
                    # The session's total before this turn is not known (a turn in
                    # between was cut off before its cost was kept): this total
                    # holds that turn's spend too, and says so (§7).
                    earlier = True
                share = self._cost_total - before if before is not None else self._cost_total
                # A total below the last one is a new session behind the same id.
                cost = share if share >= 0 else self._cost_total
            cost = round(cost, 6)
        tokens = self._tokens.usage()
        return attrs.evolve(tokens, cost_usd=cost,
                            turns=1 if self.stop_reason is not None else None,
                            model=self.model, includes_earlier_turns=earlier)

    def session_totals(self) -> Usage | None:
        if self._session is None:
            # No session opened: the lane's (when it has one) is as it was. Saying
            # nothing would make the runner take this turn for one whose spending
            # went unreported (includes_earlier_turns on the next one).
            return self.usage_before if self._resume is not None else None
        if self._cost_total is not None:
            return Usage(cost_usd=self._cost_total)
        # Nothing said this turn: the session's total is what it was.
        before = None if self._fresh or self._fresh_cost else self.usage_before.cost_usd
        return Usage(cost_usd=before)

    def finish(self, result: ProcessResult) -> Outcome | None:
        usage = self.usage().known()
        if self.error is not None:
            return Outcome.failure(self._said(self.error), session_id=self.session_id,
                                   usage=usage)
        refused = self._refused_tools[-1] if self._refused_tools else None
        if self.stop_reason == "end_turn":
            text = self._reply.text()
            if not text.strip():
                # Nothing said is no answer (OpenCode after a refused tool): only
                # NO_REPLY means "send nothing".
                return Outcome.failure(acp_no_reply(refused), session_id=self.session_id,
                                       usage=usage)
            reply = final_reply(text, cut=self._reply.cut)
            return Outcome(ok=True, reply=reply, session_id=self.session_id, usage=usage)
        if self.stop_reason == "cancelled" and refused is not None and self._refusal_ends:
            return Outcome.failure(acp_refusal_ended(refused), session_id=self.session_id,
                                   usage=usage)
        if self.stop_reason is not None:
            return Outcome.failure(acp_stopped(self.stop_reason), session_id=self.session_id,
                                   usage=usage)
        if self._setup_step is not None and result.exit_code != 0:
            # Stopped at SETUP_S (or died) while a step before the prompt waited.
            return Outcome.failure(
                f"the agent did not answer {self._setup_step} (ACP {self._phase.value}) "
                f"within {SETUP_S:.0f} s, or died first; its last error: "
                f"{result.last_stderr_line or 'none'}", session_id=self.session_id, usage=usage)
        # No answer to the prompt: the agent died (or hung up) first.
        if result.last_stderr_line:
            self._limit(result.last_stderr_line)
        if result.exit_code != 0:
            if self.limit is not None and self.limit.state == "limited":
                return Outcome.failure(self._said(result.last_stderr_line or ACP_NO_ANSWER),
                                       session_id=self.session_id, usage=usage)
            return None  # the runner names the exit status and the last stderr line
        error = ACP_NO_ANSWER
        if self.garbage:
            error += f"; {self.garbage} line(s) on its stdout were not ACP messages"
        if result.overlong_lines:
            error += f"; {result.overlong_lines} over-long line(s) were skipped"
        if result.last_stderr_line:
            error += f"; its last error: {result.last_stderr_line}"
        return Outcome.failure(error, session_id=self.session_id, usage=usage)

    def _said(self, error: str) -> str:
        return one_line(with_limit(error, self.limit, "the account's"), _ERROR_CHARS)
