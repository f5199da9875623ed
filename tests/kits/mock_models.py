"""A mock model endpoint on 127.0.0.1 for real agent CLIs: the Anthropic Messages
API (``POST /v1/messages``), the OpenAI Responses API (``POST /v1/responses``), the
OpenAI Chat Completions API (``POST /v1/chat/completions``) and the Gemini API
(``POST /v1beta/models/<model>:streamGenerateContent`` and ``:generateContent``),
each answering with a fixed text, streamed the way each API streams (server-sent
events), so that an agent pointed at it by its documented settings
(``ANTHROPIC_BASE_URL``, a Codex ``model_providers`` entry, ``OPENAI_BASE_URL``,
``GOOGLE_GEMINI_BASE_URL``) completes a turn without a network or a login.

A request whose conversation asks for ``RUN_A_TOOL`` gets a shell tool call first
(Anthropic ``tool_use`` of ``Bash``, Codex's ``exec_command`` asking to leave its
sandbox, Gemini's and Qwen's ``run_shell_command``, OpenCode's ``bash``), and the
text once the tool's result comes back. With ``hold`` set, every answer waits for
it: a turn the test cancels.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import trio

from tests.kits.asgi import lifespan, read_body

TOOL_WORD = "RUN_A_TOOL"
#: The shell command the tool call runs: it leaves a file, so it needs a permission.
TOOL_COMMAND = "touch made-by-the-tool && echo mock-tool-ran"


@attrs.define
class MockModel:
    reply: str = "Hello from the mock model."
    #: (path, body) of every request, in order.
    requests: list[tuple[str, dict[str, Any]]] = attrs.Factory(list)
    #: When not ``None``, answers wait for it to be set (``held`` says one waits).
    hold: trio.Event | None = None
    held: trio.Event = attrs.Factory(trio.Event)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        body = await read_body(receive)
        try:
            request = json.loads(body) if body else {}
        except ValueError:
            request = {}
        path = scope["path"]
        self.requests.append((path, request))
        if path.endswith("/messages/count_tokens"):
            await _json(send, {"input_tokens": 10})
            return
        if path.endswith(":countTokens"):
            await _json(send, {"totalTokens": 10})
            return
        if self.hold is not None and scope["method"] == "POST":
            self.held.set()
            await self.hold.wait()
        if path.endswith("/messages"):
            await self._anthropic(send, request)
        elif path.endswith("/responses"):
            await self._responses(send, request)
        elif path.endswith("/chat/completions"):
            await self._chat(send, request)
        elif ":streamGenerateContent" in path or ":generateContent" in path:
            await self._gemini(send, path, request)
        else:
            await _json(send, {"error": {"message": f"mock: no {path}"}}, status=404)

    async def _anthropic(self, send: Any, request: dict[str, Any]) -> None:
        messages = request.get("messages") or []
        text = json.dumps(messages)
        last = messages[-1] if messages else {}
        answered = "tool_result" in json.dumps(last.get("content", ""))
        tool = TOOL_WORD in text and not answered
        message = {"id": "msg_mock", "type": "message", "role": "assistant",
                   "model": request.get("model", "mock"), "content": [],
                   "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": 10, "output_tokens": 1,
                             "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}}
        block: dict[str, Any]
        if tool:
            block = {"type": "tool_use", "id": "toolu_mock1", "name": "Bash",
                     "input": {"command": TOOL_COMMAND, "description": "Make a file"}}
        else:
            block = {"type": "text", "text": self.reply}
        if not request.get("stream"):
            await _json(send, {**message, "content": [block],
                               "stop_reason": "tool_use" if tool else "end_turn"})
            return
        events: list[tuple[str, dict[str, Any]]] = [
            ("message_start", {"type": "message_start", "message": message})]
        if tool:
            events += [
                ("content_block_start", {"type": "content_block_start", "index": 0,
                                         "content_block": {**block, "input": {}}}),
                ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {
                    "type": "input_json_delta", "partial_json": json.dumps(block["input"])}}),
            ]
        else:
            events += [
                ("content_block_start", {"type": "content_block_start", "index": 0,
                                         "content_block": {"type": "text", "text": ""}}),
                ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                         "delta": {"type": "text_delta", "text": self.reply}}),
            ]
        events += [
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta",
                               "delta": {"stop_reason": "tool_use" if tool else "end_turn",
                                         "stop_sequence": None},
                               "usage": {"output_tokens": 5}}),
            ("message_stop", {"type": "message_stop"}),
        ]
        await _sse(send, events)

    async def _responses(self, send: Any, request: dict[str, Any]) -> None:
        given = json.dumps(request.get("input", ""))
        if TOOL_WORD in given and "function_call_output" not in given:
            # Codex's exec_command, asking to leave its sandbox: Codex asks first.
            call = {"type": "function_call", "id": "fc_mock", "call_id": "call_mock1",
                    "name": "exec_command", "status": "completed",
                    "arguments": json.dumps({"cmd": TOOL_COMMAND,
                                             "sandbox_permissions": "require_escalated",
                                             "justification": "Make a file"})}
            await _sse(send, [
                ("response.created", {"type": "response.created",
                                      "response": {"id": "resp_tool", "status": "in_progress"}}),
                ("response.output_item.done", {"type": "response.output_item.done",
                                               "output_index": 0, "item": call}),
                ("response.completed", {"type": "response.completed", "response": {
                    "id": "resp_tool", "status": "completed", "output": [call],
                    "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15,
                              "input_tokens_details": {"cached_tokens": 0},
                              "output_tokens_details": {"reasoning_tokens": 0}}}}),
            ])
            return
        item = {"type": "message", "role": "assistant", "id": "msg_mock", "status": "completed",
                "content": [{"type": "output_text", "text": self.reply, "annotations": []}]}
        usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": 15}
        await _sse(send, [
            ("response.created", {"type": "response.created",
                                  "response": {"id": "resp_mock", "status": "in_progress"}}),
            ("response.output_item.added", {"type": "response.output_item.added",
                                            "output_index": 0, "item": {**item, "content": []}}),
            ("response.output_text.delta", {"type": "response.output_text.delta",
                                            "item_id": "msg_mock", "output_index": 0,
                                            "content_index": 0, "delta": self.reply}),
            ("response.output_item.done", {"type": "response.output_item.done",
                                           "output_index": 0, "item": item}),
            ("response.completed", {"type": "response.completed", "response": {
                "id": "resp_mock", "status": "completed", "usage": usage, "output": [item]}}),
        ])

    async def _chat(self, send: Any, request: dict[str, Any]) -> None:
        """OpenAI Chat Completions (Qwen Code with an OpenAI-compatible provider)."""
        given = json.dumps(request.get("messages", ""))
        tool = TOOL_WORD in given and '"role": "tool"' not in given
        offered = {(entry.get("function") or {}).get("name")
                   for entry in request.get("tools") or [] if isinstance(entry, dict)}
        # Qwen Code's shell tool, or OpenCode's.
        shell = "bash" if "bash" in offered else "run_shell_command"
        delta: dict[str, Any] = {"role": "assistant", "content": self.reply}
        if tool:
            delta = {"role": "assistant", "content": None, "tool_calls": [{
                "index": 0, "id": "call_mock1", "type": "function",
                "function": {"name": shell, "arguments": json.dumps(
                    {"command": TOOL_COMMAND, "description": "Make a file"})}}]}
        finish = "tool_calls" if tool else "stop"
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        head = {"id": "chatcmpl-mock", "created": 0, "model": request.get("model", "mock")}
        if not request.get("stream"):
            message = {key: value for key, value in delta.items() if key != "index"}
            await _json(send, {**head, "object": "chat.completion", "usage": usage, "choices": [
                {"index": 0, "message": message, "finish_reason": finish}]})
            return
        chunk = {**head, "object": "chat.completion.chunk"}
        await _sse(send, [
            ("", {**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}),
            ("", {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
                  "usage": usage}),
        ], done=True)

    async def _gemini(self, send: Any, path: str, request: dict[str, Any]) -> None:
        given = json.dumps(request.get("contents", ""))
        part: dict[str, Any] = {"text": self.reply}
        if TOOL_WORD in given and "functionResponse" not in given:
            part = {"functionCall": {"name": "run_shell_command", "args": {
                "command": TOOL_COMMAND, "description": "Make a file"}}}
        answer = {"candidates": [{"content": {"parts": [part], "role": "model"},
                                  "finishReason": "STOP", "index": 0}],
                  "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5,
                                    "totalTokenCount": 15},
                  "modelVersion": "mock-gemini"}
        if ":streamGenerateContent" in path:
            await _sse(send, [("", answer)])
        else:
            await _json(send, answer)


async def _json(send: Any, body: dict[str, Any], status: int = 200) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


async def _sse(send: Any, events: list[tuple[str, dict[str, Any]]], *,
               done: bool = False) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream"),
                            (b"cache-control", b"no-cache")]})
    for name, data in events:
        head = f"event: {name}\n" if name else ""
        await send({"type": "http.response.body", "more_body": True,
                    "body": f"{head}data: {json.dumps(data)}\n\n".encode()})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n" if done else b""})
