"""``prohost server``: run the reference server in the foreground until a signal."""

from __future__ import annotations

import errno
import signal
import sys
from pathlib import Path

import trio

from prohost.server import ServerConfig, ServerHandle, StateError, serve
from prohost.server.pairings import pairings_path


def _banner(handle: ServerHandle) -> str:
    faults = (
        [f"  fault hooks:  {handle.http_url}/v1/faults (see prohost server --help)"]
        if handle.state.faults.enabled
        else []
    )
    state_dir = handle.state.state_dir
    kept = (
        f"  pairings:     {pairings_path(state_dir)} (kept across restarts)"
        if state_dir is not None
        else "  pairings:     in memory only (lost when the server stops)"
    )
    return "\n".join(
        [
            "prohost reference server",
            f"  pairing code: {handle.pairing_code}",
            kept,
            f"  WebSocket:    {handle.ws_url}",
            f"  HTTP:         {handle.http_url}",
            *faults,
            "Pair a harness with (a code works once; the log shows the next one):",
            f"  prohost agent pair --code {handle.pairing_code} --url {handle.ws_url}",
            "Ctrl-C stops the server.",
        ]
    )


def _first_leaf(group: BaseException) -> BaseException:
    while isinstance(group, BaseExceptionGroup):
        group = group.exceptions[0]
    return group


def _listen_failure(host: str, port: int, failure: BaseException) -> str:
    reason = getattr(failure, "strerror", None) or str(failure)
    line = f"prohost server: cannot listen on {host}:{port}: {reason}"
    if getattr(failure, "errno", None) == errno.EADDRINUSE:
        line += (f"; another program (another prohost server?) has port {port}: stop it, "
                 "or give --port 0 to take any free port (the banner says which)")
    return line


async def run_server_command(
    host: str,
    port: int,
    faults: bool = False,
    state_dir: Path | None = None,
    retries: int = 0,
) -> int:
    """Serve on ``host:port`` until SIGINT/SIGTERM; a second signal stops at once.
    ``faults`` serves the soak's fault hooks (:mod:`prohost.server.faults`);
    ``state_dir`` keeps the pairings across restarts; ``retries`` is how often a
    retryable failure is submitted again.

    Cancelled: the server stops at once, without close frames.
    """
    failure: BaseException | None = None
    unusable: BaseException | None = None
    handle: ServerHandle | None = None
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        try:
            async with trio.open_nursery() as nursery:

                async def serve_then_stop(*, task_status: trio.TaskStatus[ServerHandle]) -> None:
                    config = ServerConfig(
                        host=host, port=port, faults=faults, state_dir=state_dir,
                        retries=retries,
                    )
                    await serve(config, task_status=task_status)
                    nursery.cancel_scope.cancel()

                started: ServerHandle = await nursery.start(serve_then_stop)
                handle = started
                print(_banner(started), flush=True)
                signals_seen = 0
                async for _ in signals:
                    signals_seen += 1
                    if signals_seen == 1:
                        print("shutting down…", file=sys.stderr, flush=True)
                        started.shutdown()
                    else:
                        nursery.cancel_scope.cancel()
        except* StateError as group:
            unusable = _first_leaf(group)
        except* OSError as group:
            if handle is not None:  # not a failure to bind: let it be seen whole
                raise
            failure = _first_leaf(group)
    if unusable is not None:
        print(f"prohost server: error: {unusable}", file=sys.stderr)
        return 1
    if failure is not None:
        print(_listen_failure(host, port, failure), file=sys.stderr)
        return 1
    return 0
