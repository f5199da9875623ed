"""The reference server: what ``prohost server``, the demo, the benchmarks and the
tests run against. It speaks PROTOCOL.md from the server side, on one port, with
hypercorn's trio worker serving :class:`prohost.server.app.App`.

In-process use::

    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve, ServerConfig())
        credentials = server.pair("studio")
        run_id = await server.submit_run("hello", conversation_id="C1")
        await server.wait_until(lambda state: state.runs[run_id].state == "completed")
        server.shutdown()
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

import attrs
import hypercorn.config
import hypercorn.trio
import trio

from prohost.protocol import MAX_MESSAGE_BYTES
from prohost.server.app import App, abort_socket, run_dispatcher
from prohost.server.state import WS_PATH, RunRecord, ServerState, generate_pairing_code

__all__ = ["ServerConfig", "ServerHandle", "ServerState", "serve"]

#: hypercorn's own messages ("Running on …") stay quiet unless something goes wrong.
_hypercorn_log = logging.getLogger("prohost.server.hypercorn")
if _hypercorn_log.level == logging.NOTSET:
    _hypercorn_log.setLevel(logging.WARNING)

#: WebSocket close code sent to harnesses when the server shuts down (going away).
GOING_AWAY = 1001


@attrs.define
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 0
    #: Sent in ``hello``; the server pings every heartbeat_s.
    heartbeat_s: float = 15.0
    #: An unacked delivery is sent again after this long.
    redeliver_after_s: float = 10.0
    #: Generated (format ``ABCD-1234``) when None.
    pairing_code: str | None = None


@attrs.define(eq=False)
class ServerHandle:
    """A running server, as tests and the demo drive it in-process."""

    http_url: str
    ws_url: str
    pairing_code: str
    state: ServerState
    _stop: trio.Event

    def pair(self, machine: str) -> dict[str, str]:
        """What ``POST /v1/agent/pair`` answers to the right code: the credentials."""
        return self.state.credentials(self.state.pair(machine))

    def run(self, run_id: str) -> RunRecord:
        return self.state.runs[run_id]

    async def submit_run(
        self, text: str, conversation_id: str | None = None, **extra_body_fields: Any
    ) -> str:
        """Queue a run (like ``POST /v1/runs``); returns its run_id."""
        return self.state.add_run(text, conversation_id, extra_body_fields).run_id

    async def cancel_run(self, run_id: str, reason: str | None = None) -> None:
        """Like ``DELETE /v1/runs/<id>``; a finished run is left as it is."""
        self.state.cancel_run(self.state.runs[run_id], reason)

    def close_run(self, run_id: str) -> None:
        """Forget a run server-side: completions get 404, heartbeats hear ``unknown``."""
        self.state.close_run(self.state.runs[run_id])

    async def send_raw(self, text: str) -> None:
        """Send one raw text frame to every connected harness."""
        for conn in list(self.state.connections.values()):
            conn.send(text)

    async def drop_connections(self) -> None:
        """Abort every harness socket abruptly (no close frame) and wait until the
        server has let go of them."""
        dropped = set()
        for conn in list(self.state.connections.values()):
            if not abort_socket(conn):
                conn.close(GOING_AWAY)
            conn.cancel_scope.cancel()
            dropped.add(conn.id)
        await self.wait_until(lambda state: dropped.isdisjoint(state.connections))

    async def wait_until(self, predicate: Callable[[ServerState], bool]) -> None:
        """Return once ``predicate(state)`` holds, re-checking after every change."""
        while not predicate(self.state):
            await self.state.wait_changed()

    def shutdown(self) -> None:
        """Close the harness sockets (1001) and stop serving; ``serve`` then returns."""
        self._stop.set()


def _hypercorn_config(config: ServerConfig) -> hypercorn.config.Config:
    hc = hypercorn.config.Config()
    host = config.host
    hc.bind = [f"[{host}]:{config.port}" if ":" in host else f"{host}:{config.port}"]
    hc.accesslog = None
    hc.errorlog = _hypercorn_log
    hc.websocket_max_message_size = MAX_MESSAGE_BYTES
    hc.graceful_timeout = 2.0
    return hc


def _local_url(bind: str) -> str:
    """A dialable URL for a bound address (a wildcard becomes loopback)."""
    for wildcard, loopback in (("//0.0.0.0:", "//127.0.0.1:"), ("//[::]:", "//[::1]:")):
        bind = bind.replace(wildcard, loopback)
    return bind


async def serve(
    config: ServerConfig, *, task_status: trio.TaskStatus[ServerHandle] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run the server until cancelled or ``handle.shutdown()``.

    ``task_status.started`` gets the :class:`ServerHandle` once the port is bound.
    """
    state = ServerState(
        pairing_code=config.pairing_code or generate_pairing_code(),
        heartbeat_s=config.heartbeat_s,
        redeliver_after_s=config.redeliver_after_s,
    )
    stop = trio.Event()

    async def shutdown_trigger() -> None:
        await stop.wait()
        state.close_connections(GOING_AWAY)

    async with trio.open_nursery() as nursery:

        async def run_hypercorn(*, task_status: trio.TaskStatus[list[str]]) -> None:
            try:
                await hypercorn.trio.serve(
                    cast(Any, App(state)),
                    _hypercorn_config(config),
                    shutdown_trigger=shutdown_trigger,
                    task_status=task_status,
                )
            finally:
                nursery.cancel_scope.cancel()

        binds: list[str] = await nursery.start(run_hypercorn)
        state.http_url = _local_url(binds[0])
        state.ws_url = "ws" + state.http_url.removeprefix("http") + WS_PATH
        nursery.start_soon(run_dispatcher, state)
        task_status.started(
            ServerHandle(state.http_url, state.ws_url, state.pairing_code, state, stop)
        )
