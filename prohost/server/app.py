"""The reference server's ASGI app: the harness WebSocket and the HTTP API on one port.

Hand-written on purpose (no web framework): the routes are few, and the server
must control exact statuses, including the status of a refused WebSocket upgrade
(the ASGI ``websocket.http.response`` extension, which hypercorn supports). The
plumbing under the routes (headers, bounded bodies, errors that carry a status)
is :mod:`prohost.server.asgi`.

Routes (docs/protocol.md §7, §8, §10, §11):

- ``GET  /v1/agent/ws``                     the harness WebSocket (Bearer token)
- ``POST /v1/agent/pair``                   pairing code → credentials
- ``POST /v1/agent/runs/<id>/complete``     a run's result (Bearer token)
- ``POST /v1/agent/runs/<id>/timeline``     a run's tool-call events (Bearer token)
- ``POST /v1/runs``, ``GET /v1/runs``, ``GET /v1/runs/<id>``, ``DELETE /v1/runs/<id>``
- ``GET  /v1/status``                       the harnesses connected now, and those
  expected back (for ``send --wait``)
- ``/v1/faults/…``                          the soak's fault hooks, only with ``--faults``
  (:mod:`prohost.server.faults`)

Every route of the people's API that changes something (``POST /v1/runs``,
``DELETE /v1/runs/<id>``, the fault hooks) requires the server's API token
(:mod:`prohost.server.apitoken`): else 401, saying where the token is.

Each WebSocket gets its own nursery (reader, writer; the dispatcher pings) that ends when the
socket does; an exception in one connection is logged and ends only that one.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any
from urllib.parse import parse_qs

import trio

from prohost.invocation import command
from prohost.server import faults
from prohost.server.apitoken import token_matches
from prohost.server.asgi import (
    Disconnected,
    HttpError,
    Receive,
    Scope,
    Send,
    answer_lifespan,
    bearer,
    header,
    json_bytes,
    json_or_none,
    parse_json,
    read_body,
    read_json,
    reject,
)
from prohost.server.faults import FaultError, _address, abort_socket
from prohost.server.state import WS_PATH, CompletionPost, Connection, RunRecord, ServerState
from prohost.wire.protocol import DecodeError, decode

__all__ = ["App", "abort_socket", "run_dispatcher"]

log = logging.getLogger("prohost.server")

#: WebSocket close code for a harness the server lets go of (going away).
GOING_AWAY = 1001
#: What a harness closes its socket with when it goes on purpose.
NORMAL_CLOSURE = 1000


class App:
    """The ASGI application. One instance per server; all state lives in ``state``."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "websocket":
            await self._websocket(scope, receive, send)
        elif kind == "lifespan":
            await answer_lifespan(receive, send)


    # ------------------------------------------------------------------ WebSocket

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        first = await receive()
        if first["type"] != "websocket.connect":
            return
        state = self.state
        token = bearer(scope)
        if scope["path"] != WS_PATH:
            await reject(scope, send, 404, "no such WebSocket endpoint")
            return
        if state.handshake_status is not None:
            await reject(scope, send, state.handshake_status, "refused by the server")
            return
        if token is None or state.harness_for(token) is None:
            await reject(scope, send, 401, "unknown or missing token; pair this machine: "
                         f"`{command('agent', 'pair', '--code', 'CODE', '--url', 'URL')}`")
            return
        await send({"type": "websocket.accept"})
        conn, outbox = state.add_connection(
            token,
            machine=header(scope, b"x-prohost-machine"),
            agent=header(scope, b"x-prohost-agent"),
            client=_address(scope.get("client")),
            server=_address(scope.get("server")),
        )
        try:
            with conn.cancel_scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._writer, conn, outbox, send)
                    await self._reader(conn, receive)
                    nursery.cancel_scope.cancel()
        except Exception:
            log.exception("connection %d failed", conn.id)
        finally:
            state.remove_connection(conn)
            conn.outbox.close()
        if conn.close_code is not None:
            with trio.move_on_after(2, shield=True), contextlib.suppress(Exception):
                await send({"type": "websocket.close", "code": conn.close_code})

    async def _reader(self, conn: Connection, receive: Receive) -> None:
        while True:
            event = await receive()
            if event["type"] == "websocket.disconnect":
                conn.closed_by_harness = event.get("code") == NORMAL_CLOSURE
                return
            if event["type"] != "websocket.receive":
                continue
            text = event.get("text")
            if text is None:
                data = event.get("bytes") or b""
                self.state.record_malformed(conn, repr(data[:200]), "binary frame")
                continue
            try:
                message = decode(text)
            except DecodeError as exc:
                self.state.record_malformed(conn, text, str(exc))
                continue
            try:
                self.state.on_message(conn, message)
            except Exception:  # one odd message must not end the connection
                log.exception("connection %d: handling %r failed", conn.id, message)

    async def _writer(
        self, conn: Connection, outbox: trio.MemoryReceiveChannel[str], send: Send
    ) -> None:
        async with outbox:
            async for text in outbox:
                if self.state.silent:
                    continue
                await send({"type": "websocket.send", "text": text})
                self.state.record_sent(conn, text)

    # ------------------------------------------------------------------ HTTP

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            status, payload, headers = await self._route(scope, receive)
        except Disconnected:
            return
        except HttpError as exc:
            status, payload, headers = exc.status, {"error": exc.message}, {}
        except Exception:
            log.exception("%s %s failed", scope.get("method"), scope.get("path"))
            status, payload, headers = 500, {"error": "internal server error"}, {}
        body = json_bytes(payload)
        raw_headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()),
        ]
        await send({"type": "http.response.start", "status": status, "headers": raw_headers})
        await send({"type": "http.response.body", "body": body})

    async def _route(self, scope: Scope, receive: Receive) -> tuple[int, Any, dict[str, str]]:
        method = scope["method"]
        parts = [p for p in scope["path"].split("/") if p]

        def allow(*methods: str) -> None:
            if method not in methods:
                raise HttpError(405, f"{method} is not allowed here; use {' or '.join(methods)}")

        if parts == ["v1", "agent", "pair"]:
            allow("POST")
            return await self._pair(scope, await read_json(receive))
        if len(parts) == 5 and parts[:3] == ["v1", "agent", "runs"]:
            if parts[4] == "complete":
                allow("POST")
                return await self._complete(scope, receive, parts[3])
            if parts[4] == "timeline":
                allow("POST")
                return await self._timeline(scope, receive, parts[3])
        if parts == ["v1", "status"]:
            allow("GET")
            return 200, self.state.status_view(), {}
        if parts == ["v1", "runs"]:
            allow("GET", "POST")
            if method == "GET":
                runs = [self.state.run_view(r) for r in self.state.runs.values()]
                return 200, {"runs": runs}, {}
            self._require_api_token(scope, "submitting a run")
            return await self._submit(await read_json(receive))
        if parts[:2] == ["v1", "faults"] and self.state.faults.enabled:
            self._require_api_token(scope, "the fault hooks")
            return await self._fault(method, parts[2:], receive)
        if len(parts) == 3 and parts[:2] == ["v1", "runs"]:
            allow("GET", "DELETE")
            run = self.state.runs.get(parts[2])
            if run is None:
                raise HttpError(404, f"no run {parts[2]}")
            if method == "GET":
                return 200, self.state.run_view(run), {}
            self._require_api_token(scope, "cancelling a run")
            return await self._delete(scope, receive, run)
        raise HttpError(404, f"no route for {scope['path']}")

    def _require_api_token(self, scope: Scope, what: str) -> None:
        """A 401 unless the request carries the server's API token: any local
        process (a confined agent run included) can reach this port."""
        if token_matches(self.state.api_token, bearer(scope)):
            return
        where = self.state.api_token_file
        found = (f"the token this server wrote to {where} (`prohost send` and `prohost "
                 f"runs cancel` read it there; give them --state {where.parent})"
                 if where is not None else "the token this server was started with")
        raise HttpError(401, f"{what} needs the server's API token: send "
                             f"'Authorization: Bearer <token>' with {found}")

    async def _fault(
        self, method: str, parts: list[str], receive: Receive
    ) -> tuple[int, Any, dict[str, str]]:
        """The soak's hooks (:mod:`prohost.server.faults`); reached only with --faults."""
        state = self.state
        if method == "GET" and parts in ([], ["runs"]):
            if parts:
                return 200, {"runs": faults.audit(state)}, {}
            return 200, state.faults.view(len(state.completion_faults)), {}
        if method != "POST" or len(parts) != 1:
            raise HttpError(404, "fault hooks: POST drop, storm, restart, forget, redeliver, hold "
                                 "or release; "
                                 "GET runs")
        raw = await read_body(receive)
        data = parse_json(raw) if raw.strip() else {}
        if not isinstance(data, dict):
            raise HttpError(400, "expected a JSON object")
        try:
            if parts == ["drop"]:
                return 200, {"dropped": len(faults.drop_all(state, GOING_AWAY))}, {}
            if parts == ["storm"]:
                faults.storm(state, data.get("status"), data.get("count", 1),
                             data.get("retry_after"))
                return 200, {"storm_left": len(state.completion_faults)}, {}
            if parts == ["restart"]:
                faults.request_restart(state, data.get("down_s", 1.0))
                return 202, {"down_s": state.faults.restart_down_s}, {}
            if parts == ["forget"]:
                faults.forget(state, data.get("count"), data.get("run_id"))
                return 200, state.faults.view(len(state.completion_faults)), {}
            if parts == ["redeliver"]:
                return 200, faults.redeliver(state, data.get("run_id")), {}
            if parts in (["hold"], ["release"]):
                faults.hold(state, data.get("run_id"), parts == ["hold"])
                return 200, state.faults.view(len(state.completion_faults)), {}
        except faults.NoHarness as exc:
            raise HttpError(409, str(exc)) from None
        except FaultError as exc:
            raise HttpError(400, str(exc)) from None
        raise HttpError(404, f"no fault hook {parts[0]!r}; use drop, storm, restart, forget, "
                             "redeliver, hold or release")

    async def _pair(self, scope: Scope, data: Any) -> tuple[int, Any, dict[str, str]]:
        if not isinstance(data, dict):
            raise HttpError(400, "expected a JSON object {code, machine}")
        code = data.get("code")
        machine = data.get("machine")
        if not isinstance(code, str) or not code:
            raise HttpError(400, "code is required (a string like ABCD-1234)")
        if machine is not None and not isinstance(machine, str):
            raise HttpError(400, "machine must be a string")
        try:
            harness = self.state.pair_with_code(code, machine or "unnamed")
        except OSError as exc:
            log.error("cannot save the pairing: %s", exc)
            raise HttpError(500, "the server could not save the pairing; see its log") from None
        if harness is None:
            if self.state.code_was_used(code):
                raise HttpError(403, "this pairing code was used already (a code works "
                                     "once); the server's log shows the next one")
            raise HttpError(403, "wrong pairing code")
        http_url, ws_url = _urls_from_host(scope, self.state)
        return 200, self.state.credentials(harness, http_url=http_url, ws_url=ws_url), {}

    async def _complete(
        self, scope: Scope, receive: Receive, run_id: str
    ) -> tuple[int, Any, dict[str, str]]:
        raw = await read_body(receive)
        state = self.state
        await faults.wait_while_held(state, run_id)
        run = state.runs.get(run_id)
        forgotten = False
        try:
            status, answer, headers, forgotten = self._judge_completion(scope, run, run_id, raw)
        except HttpError as exc:
            status, answer, headers = exc.status, {"error": exc.message}, {}
        if run is not None:
            run.completion_posts += 1
            key = header(scope, b"idempotency-key")
            run.idempotency_keys.append(key)
            run.posts.append(CompletionPost(status, json_or_none(raw), key, forgotten,
                                            state.clock()))
            state.changed()
        return status, answer, headers

    def _judge_completion(
        self, scope: Scope, run: RunRecord | None, run_id: str, raw: bytes
    ) -> tuple[int, Any, dict[str, str], bool]:
        """The answer to one completion POST (status, body, headers, forgotten)."""
        state = self.state
        if state.completion_faults:
            status, headers = state.completion_faults.pop(0)
            return status, {"error": f"injected fault {status}"}, dict(headers), False
        if state.harness_for(bearer(scope)) is None:
            raise HttpError(401, "a paired harness token is required")
        if run is None or run.state == "closed":
            raise HttpError(404, f"no open run {run_id}")
        payload = parse_json(raw)
        if not isinstance(payload, dict):
            raise HttpError(400, "expected a JSON object")
        if not isinstance(payload.get("ok"), bool):
            raise HttpError(400, "ok is required (true or false)")
        if not isinstance(payload.get("confined", False), bool):
            raise HttpError(400, "confined must be true or false when given (§7)")
        if payload.get("run_id", run_id) != run_id:
            raise HttpError(400, f"run_id {payload.get('run_id')!r} does not match the path")
        if run.completion is not None:
            raise HttpError(409, f"run {run_id} is already completed")
        if state.faults.take_forget(run_id):
            return 200, {"ok": True}, {}, True
        state.record_completion(run, payload)
        return 200, {"ok": True}, {}, False

    async def _timeline(
        self, scope: Scope, receive: Receive, run_id: str
    ) -> tuple[int, Any, dict[str, str]]:
        raw = await read_body(receive)
        if self.state.harness_for(bearer(scope)) is None:
            raise HttpError(401, "a paired harness token is required")
        run = self.state.runs.get(run_id)
        if run is None or run.state == "closed":
            raise HttpError(404, f"no open run {run_id}")
        payload = parse_json(raw)
        if not isinstance(payload, dict) or not isinstance(payload.get("events"), list):
            raise HttpError(400, "expected a JSON object with an events list")
        run.timeline.extend(payload["events"])
        self.state.changed()
        return 200, {"ok": True}, {}

    async def _submit(self, data: Any) -> tuple[int, Any, dict[str, str]]:
        if not isinstance(data, dict):
            raise HttpError(400, "expected a JSON object {conversation_id, text}")
        fields = dict(data)
        text = fields.pop("text", None)
        conversation_id = fields.pop("conversation_id", None)
        if not isinstance(text, str):
            raise HttpError(400, "text is required (a string)")
        if conversation_id is not None and not isinstance(conversation_id, str):
            raise HttpError(400, "conversation_id must be a string or null")
        try:
            run = self.state.add_run(text, conversation_id or None, fields)
        except ValueError as exc:
            raise HttpError(409 if "exists" in str(exc) else 400, str(exc)) from None
        return 201, {"run_id": run.run_id}, {}

    async def _delete(
        self, scope: Scope, receive: Receive, run: RunRecord
    ) -> tuple[int, Any, dict[str, str]]:
        raw = await read_body(receive)
        reason: Any = None
        query = parse_qs(bytes(scope.get("query_string", b"")).decode("latin-1"))
        if "reason" in query:
            reason = query["reason"][-1]
        elif raw.strip():
            data = parse_json(raw)
            reason = data.get("reason") if isinstance(data, dict) else None
        if reason is not None and not isinstance(reason, str):
            raise HttpError(400, "reason must be a string")
        if run.state in ("completed", "failed", "closed"):
            raise HttpError(409, f"run {run.run_id} is already {run.state}")
        self.state.cancel_run(run, reason or "cancelled by the user")
        return 200, self.state.run_view(run), {}


def _urls_from_host(scope: Scope, state: ServerState) -> tuple[str, str]:
    """The URLs a client that reached us through ``Host`` should use."""
    host = header(scope, b"host")
    if not host:
        return state.http_url, state.ws_url
    secure = scope.get("scheme") in ("https", "wss")
    http_url = f"{'https' if secure else 'http'}://{host}"
    ws_url = f"{'wss' if secure else 'ws'}://{host}{WS_PATH}"
    return http_url, ws_url


async def run_dispatcher(state: ServerState) -> None:
    """Ping and deliver what is due, then sleep until the next is due or anything
    changes. Cancelled: stops between two passes; nothing is half sent."""
    while True:
        next_due = state.dispatch(state.clock())
        with trio.move_on_at(next_due):
            await state.wait_changed()
