"""The reference server: what ``prohost server``, the demo, the benchmarks and the
tests run against. It speaks docs/protocol.md from the server side, on one port, with
hypercorn's trio worker serving :class:`prohost.server.app.App`.

In-process use::

    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve, ServerConfig())
        credentials = server.pair("studio")
        # Over HTTP, POST /v1/runs needs "Authorization: Bearer " + server.api_token.
        run_id = await server.submit_run("hello", conversation_id="C1")
        await server.wait_until(lambda state: state.runs[run_id].state == "completed")
        server.shutdown()
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from prohost.server import faults
from prohost.server.apitoken import new_token, write_token
from prohost.server.app import App, run_dispatcher
from prohost.server.listener import GOING_AWAY, serve_generations
from prohost.server.pairings import StateError, load_pairings
from prohost.server.seen import load_seen
from prohost.server.state import WS_PATH, RunRecord, ServerState, generate_pairing_code

__all__ = ["ServerConfig", "ServerHandle", "ServerState", "StateError", "serve"]


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
    #: How many times a retryable failure is submitted again as a new run (§11;
    #: ``prohost server --retries``); 0 keeps a run's first completion as its end.
    retries: int = 0
    #: The first retry's wait (seconds); each further one doubles it, to 30 s.
    retry_first_s: float = 1.0
    #: Where pairings are kept across restarts (``prohost server --state``); None:
    #: in memory only.
    state_dir: Path | None = None
    #: Serve the soak's fault hooks under ``/v1/faults`` (:mod:`prohost.server.faults`).
    faults: bool = False
    #: The token the people's API (submit, cancel, fault hooks) requires
    #: (:mod:`prohost.server.apitoken`); generated when None.
    api_token: str | None = None
    #: Where the token is written (``api-token``, 0600) for ``prohost send`` to read;
    #: None: ``state_dir`` (and with neither, it is only in memory: ``api_token``).
    token_dir: Path | None = None


@attrs.define(eq=False)
class ServerHandle:
    """A running server, as tests and the demo drive it in-process."""

    http_url: str
    ws_url: str
    state: ServerState
    _stop: trio.Event

    @property
    def api_token(self) -> str:
        """What ``POST /v1/runs``, ``DELETE /v1/runs/<id>`` and the fault hooks
        require as ``Authorization: Bearer <token>``."""
        return self.state.api_token

    @property
    def pairing_code(self) -> str:
        """The code that pairs the next machine (a new one after each use)."""
        return self.state.pairing_code

    def pair(self, machine: str) -> dict[str, str]:
        """What ``POST /v1/agent/pair`` answers to the right code: the credentials."""
        return self.state.credentials(self.state.pair(machine))

    def run(self, run_id: str) -> RunRecord:
        return self.state.runs[run_id]

    async def submit_run(
        self, text: str, conversation_id: str | None = None, **extra_body_fields: Any
    ) -> str:
        """Queue a run (like ``POST /v1/runs``); returns its run_id. Cancelled: the
        run is queued or not, never half."""
        return self.state.add_run(text, conversation_id, extra_body_fields).run_id

    async def cancel_run(self, run_id: str, reason: str | None = None) -> None:
        """Like ``DELETE /v1/runs/<id>``; a finished run is left as it is.
        Cancelled: the cancel happened or not, never half."""
        self.state.cancel_run(self.state.runs[run_id], reason)

    def close_run(self, run_id: str) -> None:
        """Forget a run server-side: completions get 404, heartbeats hear ``unknown``."""
        self.state.close_run(self.state.runs[run_id])

    async def send_raw(self, text: str) -> None:
        """Send one raw text frame to every connected harness. Cancelled: nothing
        more is queued."""
        for conn in list(self.state.connections.values()):
            conn.send(text)

    async def drop_connections(self) -> None:
        """Abort every harness socket abruptly (no close frame) and wait until the
        server has let go of them. Cancelled: the sockets are aborted already; the
        wait for the server to let go stops."""
        dropped = faults.drop_all(self.state, GOING_AWAY)
        await self.wait_until(lambda state: dropped.isdisjoint(state.connections))

    # ---------------------------------------------------------------- fault hooks

    def storm(self, status: int, count: int = 1, retry_after: float | None = None) -> None:
        """Answer the next ``count`` completion POSTs with ``status`` (see faults)."""
        faults.storm(self.state, status, count, retry_after)

    def hold_completions(self, run_id: str, held: bool = True) -> None:
        """Leave ``run_id``'s completion POSTs unanswered until called with ``held=False``
        (a slow server); ``state.faults.held_posts`` counts the ones waiting."""
        faults.hold(self.state, run_id, held)

    def audit(self) -> list[dict[str, Any]]:
        """Per run: state, acked, ack statuses, deliveries and every completion POST."""
        return faults.audit(self.state)

    async def wait_until(self, predicate: Callable[[ServerState], bool]) -> None:
        """Return once ``predicate(state)`` holds, re-checking after every change.
        Cancelled: returns nothing; the state is as it was."""
        while not predicate(self.state):
            await self.state.wait_changed()

    def shutdown(self) -> None:
        """Close the harness sockets (1001) and stop serving; ``serve`` then returns."""
        self._stop.set()


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
    Raises :class:`StateError` (before binding) when ``config.state_dir`` holds a
    pairings file that cannot be read, or the API token cannot be written.
    Cancelled: the listener and every connection end at once (no close frames).
    """
    state = ServerState(
        pairing_code=config.pairing_code or generate_pairing_code(),
        heartbeat_s=config.heartbeat_s,
        redeliver_after_s=config.redeliver_after_s,
        retries=config.retries,
        retry_first_s=config.retry_first_s,
        state_dir=config.state_dir,
        api_token=config.api_token or new_token(),
    )
    if config.state_dir is not None:
        # Before binding: a damaged state file is said at once, not after a pairing.
        state.harnesses.update(load_pairings(config.state_dir))
        state.seen.update(load_seen(config.state_dir))
    token_dir = config.token_dir or config.state_dir
    if token_dir is not None:
        try:
            # Before binding: no request can come before its token can be read.
            state.api_token_file = write_token(token_dir, state.api_token)
        except OSError as exc:
            raise StateError(f"cannot write the API token in {token_dir}: "
                             f"{exc.strerror or exc}") from None
    state.faults.enabled = config.faults
    stop = trio.Event()
    async with trio.open_nursery() as nursery:

        async def listen(*, task_status: trio.TaskStatus[list[str]]) -> None:
            try:
                await serve_generations(
                    App(state), state, config.host, config.port, stop, task_status=task_status
                )
            finally:
                nursery.cancel_scope.cancel()

        binds: list[str] = await nursery.start(listen)
        state.http_url = _local_url(binds[0])
        state.ws_url = "ws" + state.http_url.removeprefix("http") + WS_PATH
        nursery.start_soon(run_dispatcher, state)
        task_status.started(
            ServerHandle(state.http_url, state.ws_url, state, stop)
        )
