"""A fake agent speaking the Agent Client Protocol v1 on its stdio.

The shapes are those of agentclientprotocol/agent-client-protocol
``schema/v1/schema.json`` (``InitializeResponse``, ``NewSessionResponse``,
``SessionUpdate``, ``RequestPermissionRequest``, ``PromptResponse``…), one JSON-RPC
2.0 message per line, compact, camelCase, as the Rust and TypeScript SDKs write
them. It checks what it is sent the way an SDK would: a request without the
schema's required fields gets a ``-32602`` error.

Sessions live in ``FAKE_ACP_STATE`` (a folder, one ``<id>.json`` per session with
its history and running cost): ``session/load`` of a known session replays the
history as ``user_message_chunk``/``agent_message_chunk`` updates and answers
``null`` (as the v1 docs show); ``session/resume`` answers ``{}``; an unknown
session gets ``-32002`` "Resource not found". Which of the two it offers is
``FAKE_ACP_CAPS``: ``load`` (default), ``resume``, ``both`` or ``none``; or
``broken_resume``: both announced, but ``session/resume`` is "Method not found".

The turn is ``FAKE_ACP_SCENARIO`` (default ``reply``):

- ``reply``: three message chunks (``FAKE_ACP_REPLY`` replaces their text), a
  ``usage_update`` whose cost is the session's running total (+$0.25 a turn), and
  ``end_turn`` with the (unstable) per-turn ``usage`` tokens
- ``tools``: a tool call, a permission request with all four option kinds, the
  call completed (allowed) or failed (rejected), a second message saying which
- ``stop:<reason>``: a chunk, then that stop reason
- ``error``: the prompt answered with a JSON-RPC error (``FAKE_ACP_ERROR``'s text)
- ``crash``: a chunk, then "fake acp: crashed mid-turn" on stderr and exit 3
- ``garbage``: lines that are not JSON-RPC on stdout among the messages
- ``huge``: one agent message of 1.5 MiB in a single chunk (one 1.5 MiB line)
- ``hang``: a tool call, then wait: ``session/cancel`` makes it end the call
  ``failed`` and answer ``cancelled``; ``hang_deaf`` never answers
- ``ask_fs``: asks the client for ``fs/read_text_file`` and says what it got back
- ``exit_early``: exits 0 right after the prompt arrives, without answering

``FAKE_ACP_NAME`` is the ``agentInfo.name`` it gives; with ``FAKE_ACP_COST_PER_PROCESS``
set its cost total counts from its own start, as the Claude Code adapter's does.
With ``FAKE_ACP_AUTH`` set every session setup answers -32000 "Authentication
required" (an agent nobody logged in to); ``FAKE_ACP_AUTH=load``: only
``session/load`` and ``session/resume`` do (Gemini CLI 0.61 with only
``GEMINI_API_KEY``: ``initializeSessionConfig`` throws ``authRequired`` without a
saved auth type, while ``newSession`` falls back to the key). With
``FAKE_ACP_KEY_METHOD`` set it advertises an ``env_var`` auth method needing
``FAKE_ACP_KEY`` (codex-acp's "openai-api-key", ``src/codex_agent.rs``), and an
``authenticate`` with it (when ``FAKE_ACP_KEY`` is set) lifts the -32000.
``FAKE_ACP_OPTIONS`` sets the ``tools`` scenario's permission options:
``codex_patch`` (codex-acp's for an edit: ``approved``, and ``abort``, a
reject_once that ends the turn, ``src/thread.rs``) or ``codex_exec`` (``approved``,
``denied``, ``abort``). With ``FAKE_ACP_SILENT_REJECT`` set it says nothing after
a refused tool (OpenCode 1.18). With ``FAKE_ACP_CANCEL_ERROR`` set a cancelled
``hang`` answers -32603 (Qwen Code 0.15) and leaves its tool call open.
``FAKE_ACP_WARNING=codex`` sends Codex's model warning as a chunk of its own
without a ``messageId`` before the reply (codex-acp
``EventMsg::Warning`` → ``send_agent_text``); ``unknown``: a warning of that shape
no list knows; ``loose``: a chunk without one among the reply's named messages.
``FAKE_ACP_HUGE_ASK``: the ``tools`` scenario's permission request is one line over
8 MiB. ``FAKE_ACP_HANG=hang_init`` (or ``hang_setup``) never answers
``initialize`` (``session/new``). ``FAKE_ACP_LATE_REPLAY``: a load answers
before it replays (Gemini CLI 0.61). ``FAKE_ACP_CLOSE`` offers ``session/close`` (codex-acp,
the Claude Code adapter and OpenCode do). With ``FAKE_ACP_NO_HTTP_MCP`` set it says
it takes no MCP servers over HTTP. With ``FAKE_ACP_LINGER`` set it does not exit at
end-of-file (it waits to be stopped). Every message it receives is appended, one
JSON per line, to ``FAKE_ACP_RECORD`` when that names a file (with
``{"event": "eof"}`` at end-of-file).
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

STATE = Path(os.environ.get("FAKE_ACP_STATE") or ".fake-acp")
RECORD = os.environ.get("FAKE_ACP_RECORD")
SCENARIO = os.environ.get("FAKE_ACP_SCENARIO", "reply")
CAPS = os.environ.get("FAKE_ACP_CAPS", "load")
REPLY = os.environ.get("FAKE_ACP_REPLY")

_cancelled = False
_authenticated = False
#: What this process has spent (FAKE_ACP_COST_PER_PROCESS reports it as the total).
_spent = 0.0


#: Permission options, as each agent offers them.
OPTIONS: dict[str, list[dict[str, str]]] = {
    "all": [
        {"optionId": "always", "name": "Always allow", "kind": "allow_always"},
        {"optionId": "once", "name": "Allow", "kind": "allow_once"},
        {"optionId": "no", "name": "Reject", "kind": "reject_once"},
        {"optionId": "never", "name": "Never", "kind": "reject_always"},
    ],
    # codex-acp src/thread.rs, an apply_patch approval.
    "codex_patch": [
        {"optionId": "approved", "name": "Yes", "kind": "allow_once"},
        {"optionId": "abort", "name": "No, provide feedback", "kind": "reject_once"},
    ],
    # codex-acp src/thread.rs, an exec approval offering Denied and Abort.
    "codex_exec": [
        {"optionId": "approved", "name": "Yes", "kind": "allow_once"},
        {"optionId": "abort", "name": "No, and tell Codex what to do differently",
         "kind": "reject_once"},
        {"optionId": "denied", "name": "No, continue without running it",
         "kind": "reject_once"},
    ],
}

#: The models and modes a session setup answers with (Gemini CLI's and Qwen
#: Code's shape: ``models`` and ``modes``); ``FAKE_ACP_MODE_START`` is the mode a
#: session starts in.
CHOICES: dict[str, Any] = {
    "models": {"currentModelId": "fake-model-1",
               "availableModels": [{"modelId": "fake-model-1", "name": "Fake"},
                                   {"modelId": "fake-model-2", "name": "Fake Pro"}]},
    "modes": {"currentModeId": os.environ.get("FAKE_ACP_MODE_START", "default"),
              "availableModes": [{"id": "default", "name": "Default"},
                                 {"id": "plan", "name": "Plan"},
                                 {"id": "yolo", "name": "YOLO"}]},
}

#: Codex's warning for a model it has no metadata for, as codex-acp forwards it.
CODEX_WARNING = ("Model metadata for `fake-model-1` not found. Defaulting to fallback "
                 "metadata; this can degrade performance and cause issues.")


#: A warning no list knows, sent as codex-acp sends Codex's (one chunk, no messageId).
UNKNOWN_WARNING = "Codex could not load its plugins; it goes on without them."


def record(message: dict[str, Any]) -> None:
    if RECORD:
        with open(RECORD, "a", encoding="utf-8") as out:
            out.write(json.dumps(message) + "\n")


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def receive() -> dict[str, Any] | None:
    """The next message from the client; ``None`` at end-of-file. A
    ``session/cancel`` is noted wherever it arrives."""
    global _cancelled
    while True:
        line = sys.stdin.readline()
        if not line:
            record({"event": "eof"})
            return None
        message = json.loads(line)
        assert message.get("jsonrpc") == "2.0", message
        record(message)
        if message.get("method") == "session/cancel":
            _cancelled = True
        return message


def update(session: str, body: dict[str, Any]) -> None:
    send({"method": "session/update", "params": {"sessionId": session, "update": body}})


def chunk(session: str, text: str, message_id: str | None = None,
          kind: str = "agent_message_chunk") -> None:
    body: dict[str, Any] = {"sessionUpdate": kind, "content": {"type": "text", "text": text}}
    if message_id is not None:
        body["messageId"] = message_id
    update(session, body)


def load(session: str) -> dict[str, Any] | None:
    path = STATE / f"{session}.json"
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def save(session: str, data: dict[str, Any]) -> None:
    STATE.mkdir(parents=True, exist_ok=True)
    (STATE / f"{session}.json").write_text(json.dumps(data))


def ask(request_id: int, method: str, params: dict[str, Any]) -> dict[str, Any] | None:
    """A request to the client, and its response (other messages are recorded)."""
    send({"id": request_id, "method": method, "params": params})
    while True:
        message = receive()
        if message is None:
            return None
        if message.get("id") == request_id and "method" not in message:
            return message


def invalid(message_id: Any, what: str) -> None:
    send({"id": message_id, "error": {"code": -32602, "message": f"Invalid params: {what}"}})


def prompt_turn(message: dict[str, Any]) -> None:
    params = message["params"]
    session = params.get("sessionId")
    blocks = params.get("prompt")
    if not isinstance(session, str) or not isinstance(blocks, list):
        invalid(message["id"], "sessionId and prompt are required")
        return
    data = load(session)
    if data is None:
        send({"id": message["id"], "error": {"code": -32002, "message": "Resource not found"}})
        return
    text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
    data["history"].append({"role": "user", "text": text})
    said: list[str] = []
    stop = "end_turn"
    scenario = SCENARIO
    if scenario == "exit_early":
        sys.exit(0)
    if scenario == "crash":
        chunk(session, "Starting…")
        sys.stderr.write("fake acp: crashed mid-turn\n")
        sys.stderr.flush()
        os._exit(3)
    if scenario == "error":
        send({"id": message["id"], "error": {
            "code": -32603, "message": os.environ.get("FAKE_ACP_ERROR", "Internal error"),
            "data": {"details": "the fake agent failed on purpose"}}})
        return
    if scenario == "garbage":
        print("this is not JSON-RPC", flush=True)
        print('{"jsonrpc": "1.0", "what": "not ours"}', flush=True)
    if scenario == "huge":
        big = "x" * (1536 * 1024)
        chunk(session, big, "m1")
        said.append(big)
    elif scenario == "tools":
        if not os.environ.get("FAKE_ACP_SILENT_REJECT"):
            chunk(session, "Let me run the tests.", "m1")
        update(session, {"sessionUpdate": "tool_call", "toolCallId": "call_1",
                         "title": "Running pytest -q", "kind": "execute", "status": "pending",
                         "rawInput": {"command": "pytest -q"}})
        answer = ask(900, "session/request_permission", {
            "sessionId": session,
            "options": OPTIONS[os.environ.get("FAKE_ACP_OPTIONS", "all")],
            # With FAKE_ACP_HUGE_ASK, a whole file in the request, as the Claude Code
            # adapter sends an edit's: one line over 8 MiB (its options first).
            "toolCall": {"toolCallId": "call_1", "title": "Running pytest -q",
                         **({"content": [{"type": "diff", "path": "/w/big.txt",
                                          "newText": "y" * (9 << 20)}]}
                            if os.environ.get("FAKE_ACP_HUGE_ASK") else {})},
        })
        outcome = (answer or {}).get("result", {}).get("outcome", {})
        allowed = outcome.get("outcome") == "selected" and outcome.get("optionId") in (
            "once", "always", "approved")
        update(session, {"sessionUpdate": "tool_call_update", "toolCallId": "call_1",
                         "status": "in_progress"})
        update(session, {"sessionUpdate": "tool_call_update", "toolCallId": "call_1",
                         "status": "completed" if allowed else "failed",
                         "content": [{"type": "content",
                                      "content": {"type": "text", "text": "3 passed"}}]})
        if outcome.get("optionId") == "abort" or outcome.get("outcome") == "cancelled":
            stop = "cancelled"  # codex-acp: ReviewDecision::Abort ends the turn
        elif not allowed and os.environ.get("FAKE_ACP_SILENT_REJECT"):
            pass  # OpenCode ends the turn without a word after a rejection
        else:
            words = (f"The tool was {'allowed' if allowed else 'rejected'} "
                     f"({outcome.get('optionId')}).")
            chunk(session, words, "m2")
            said += ["Let me run the tests.", words]
    elif scenario in ("hang", "hang_deaf", "hang_asks"):
        chunk(session, "Working on it.", "m1")
        # What it spent before the cancel: a running cost, and one model call's
        # tokens the way Qwen Code sends them (emitUsageMetadata, cli.js).
        update(session, {"sessionUpdate": "usage_update", "used": 10, "size": 200000,
                         "cost": {"amount": round(data["cost"] + 0.1, 6), "currency": "USD"}})
        update(session, {"sessionUpdate": "agent_message_chunk",
                         "content": {"type": "text", "text": ""},
                         "_meta": {"usage": {"inputTokens": 30, "outputTokens": 7,
                                             "thoughtTokens": 3, "cachedReadTokens": 20,
                                             "totalTokens": 40}}})
        update(session, {"sessionUpdate": "tool_call", "toolCallId": "call_9",
                         "title": "sleep 1000", "kind": "execute", "status": "in_progress"})
        while receive() is not None:
            if _cancelled and scenario != "hang_deaf":
                break
        if not _cancelled:
            return  # end-of-file without a cancel
        if scenario == "hang_asks":
            # A tool that was already on its way asks after the cancel: the client
            # must answer "cancelled" (ACP prompt-turn.mdx, Cancellation).
            ask(902, "session/request_permission", {
                "sessionId": session,
                "toolCall": {"toolCallId": "call_10", "title": "rm -rf build"},
                "options": OPTIONS["all"]})
        if os.environ.get("FAKE_ACP_CANCEL_ERROR"):
            # Qwen Code 0.15 answers the cancelled prompt with an error, and leaves
            # its tool call open.
            send({"id": message["id"], "error": {"code": -32603, "message": "Internal error",
                                                 "data": {"details": "aborted"}}})
            return
        update(session, {"sessionUpdate": "tool_call_update", "toolCallId": "call_9",
                         "status": "failed"})
        stop = "cancelled"
    elif scenario == "ask_fs":
        answer = ask(901, "fs/read_text_file", {"sessionId": session, "path": "/etc/hostname"})
        error = (answer or {}).get("error", {})
        words = f"fs answered {error.get('code')}"
        chunk(session, words)
        said.append(words)
    elif scenario.startswith("stop:"):
        chunk(session, "Partial answer.")
        stop = scenario.split(":", 1)[1]
    else:
        parts = [REPLY] if REPLY is not None else ["Hello ", "from the ", "fake ACP agent."]
        update(session, {"sessionUpdate": "agent_thought_chunk",
                         "content": {"type": "text", "text": "Thinking about it."}})
        warning = os.environ.get("FAKE_ACP_WARNING")
        if warning in ("codex", "unknown"):
            chunk(session, CODEX_WARNING if warning == "codex" else UNKNOWN_WARNING)
            for part in parts:
                chunk(session, part)  # codex-acp names no message
        else:
            for number, part in enumerate(parts):
                if warning == "loose" and number == 1:
                    chunk(session, "Heads up: the fake agent's cache was cold.")
                chunk(session, part, "m1")
        said.append("".join(parts))
    if scenario == "garbage":
        print("WARN: more noise on stdout", flush=True)
    global _spent
    data["cost"] = round(data["cost"] + 0.25, 6)
    _spent += 0.25
    total = _spent if os.environ.get("FAKE_ACP_COST_PER_PROCESS") else data["cost"]
    update(session, {"sessionUpdate": "usage_update", "used": 1200 * len(data["history"]),
                     "size": 200000, "cost": {"amount": total, "currency": "USD"}})
    data["history"].append({"role": "agent", "text": "".join(said)})
    save(session, data)
    response: dict[str, Any] = {"stopReason": stop}
    if stop == "end_turn":
        response["usage"] = {"totalTokens": 150, "inputTokens": 100, "outputTokens": 50,
                             "cachedReadTokens": 10}
    send({"id": message["id"], "result": response})


def open_session(message: dict[str, Any]) -> None:
    method, params = message["method"], message["params"]
    if not isinstance(params.get("cwd"), str) or not os.path.isabs(params["cwd"]) or not (
            isinstance(params.get("mcpServers"), list)):
        invalid(message["id"], "cwd (absolute) and mcpServers are required")
        return
    auth = os.environ.get("FAKE_ACP_AUTH")
    if auth and not _authenticated and (auth != "load" or method != "session/new"):
        send({"id": message["id"], "error": {"code": -32000,
                                             "message": "Authentication required"}})
        return
    if method == "session/new":
        session = f"sess_{uuid.uuid4().hex[:12]}"
        save(session, {"history": [], "cost": 0.0, "cwd": params["cwd"]})
        send({"id": message["id"], "result": {"sessionId": session, **CHOICES}})
        return
    # "broken_resume": resume announced, but only load is there (Qwen Code 0.15).
    allowed = {"session/load": CAPS in ("load", "both", "broken_resume"),
               "session/resume": CAPS in ("resume", "both")}
    if not allowed[method]:
        send({"id": message["id"], "error": {"code": -32601, "message": "Method not found"}})
        return
    session = params.get("sessionId")
    data = load(session) if isinstance(session, str) else None
    if data is None:
        send({"id": message["id"], "error": {"code": -32002, "message": "Resource not found",
                                             "data": {"sessionId": session}}})
        return
    if method == "session/load":
        late = os.environ.get("FAKE_ACP_LATE_REPLAY")
        answer: Any = CHOICES if os.environ.get("FAKE_ACP_LOAD_CHOICES") else None
        if late:  # Gemini CLI 0.61: the answer first, then the history
            send({"id": message["id"], "result": answer})
        for entry in data["history"]:
            kind = "user_message_chunk" if entry["role"] == "user" else "agent_message_chunk"
            chunk(session, entry["text"], kind=kind)
        update(session, {"sessionUpdate": "usage_update", "used": 10, "size": 200000,
                         "cost": {"amount": data["cost"], "currency": "USD"}})
        if not late:
            send({"id": message["id"], "result": answer})
    else:
        send({"id": message["id"], "result": {}})


def main() -> None:
    while True:
        message = receive()
        if message is None:
            if os.environ.get("FAKE_ACP_LINGER"):
                time.sleep(3600)  # stays after end-of-file, until it is stopped
            return
        method = message.get("method")
        if method is None or "id" not in message:
            continue  # a response or a notification nobody waits for
        hang = os.environ.get("FAKE_ACP_HANG")
        if (hang == "hang_init" and method == "initialize") or (
                hang == "hang_setup" and method == "session/new"):
            time.sleep(3600)  # never answers: a start that hangs
        if method == "initialize":
            if not isinstance(message["params"].get("protocolVersion"), int):
                invalid(message["id"], "protocolVersion is required")
                continue
            session_caps: dict[str, Any] = {}
            if os.environ.get("FAKE_ACP_CLOSE"):
                session_caps["close"] = {}
            if CAPS in ("resume", "both", "broken_resume"):
                session_caps["resume"] = {}
            send({"id": message["id"], "result": {
                "protocolVersion": int(os.environ.get("FAKE_ACP_VERSION", "1")),
                "agentCapabilities": {
                    "loadSession": CAPS in ("load", "both", "broken_resume"),
                    "promptCapabilities": {"image": False, "audio": False,
                                           "embeddedContext": False},
                    "mcpCapabilities": {"http": not os.environ.get("FAKE_ACP_NO_HTTP_MCP"),
                                        "sse": False},
                    "sessionCapabilities": session_caps,
                },
                "authMethods": [{
                    "type": "env_var", "id": "fake-key", "name": "Use FAKE_ACP_KEY",
                    "vars": [{"name": "FAKE_ACP_KEY"}]}] if os.environ.get(
                        "FAKE_ACP_KEY_METHOD") else [],
                "agentInfo": {"name": os.environ.get("FAKE_ACP_NAME", "fake-acp"),
                              "version": "1.0.0"},
            }})
        elif method == "authenticate":
            global _authenticated
            if message["params"].get("methodId") == "fake-key" and os.environ.get(
                    "FAKE_ACP_KEY"):
                _authenticated = True
                send({"id": message["id"], "result": {}})
            else:
                send({"id": message["id"], "error": {
                    "code": -32603, "message": "Internal error",
                    "data": "FAKE_ACP_KEY is not set"}})
        elif method in ("session/new", "session/load", "session/resume"):
            open_session(message)
        elif method == "session/prompt":
            prompt_turn(message)
        elif method in ("session/set_model", "session/set_mode"):
            key = "modelId" if method == "session/set_model" else "modeId"
            ids = [m["modelId"] for m in CHOICES["models"]["availableModels"]] + [
                m["id"] for m in CHOICES["modes"]["availableModes"]]
            if message["params"].get(key) in ids:
                send({"id": message["id"], "result": {}})
            else:
                invalid(message["id"], f"unknown {key}")
        elif method == "session/close" and os.environ.get("FAKE_ACP_CLOSE"):
            send({"id": message["id"], "result": {}})
        else:
            send({"id": message["id"], "error": {"code": -32601, "message": "Method not found"}})


if __name__ == "__main__":
    main()
