"""``prohost server``: run the reference server in the foreground until a signal."""

from __future__ import annotations

import signal
import sys

import trio

from prohost.server import ServerConfig, ServerHandle, serve


def _banner(handle: ServerHandle) -> str:
    faults = (
        [f"  fault hooks:  {handle.http_url}/v1/faults (see prohost server --help)"]
        if handle.state.faults.enabled
        else []
    )
    return "\n".join(
        [
            "prohost reference server",
            f"  pairing code: {handle.pairing_code}",
            f"  WebSocket:    {handle.ws_url}",
            f"  HTTP:         {handle.http_url}",
            *faults,
            "Pair a harness with:",
            f"  prohost agent pair --code {handle.pairing_code} --url {handle.ws_url}",
            "Ctrl-C stops the server.",
        ]
    )


def _first_leaf(group: BaseException) -> BaseException:
    while isinstance(group, BaseExceptionGroup):
        group = group.exceptions[0]
    return group


async def run_server_command(host: str, port: int, faults: bool = False) -> int:
    """Serve on ``host:port`` until SIGINT/SIGTERM; a second signal stops at once.
    ``faults`` serves the soak's fault hooks (:mod:`prohost.server.faults`).

    Cancelled: the server stops at once, without close frames.
    """
    failure: BaseException | None = None
    handle: ServerHandle | None = None
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        try:
            async with trio.open_nursery() as nursery:

                async def serve_then_stop(*, task_status: trio.TaskStatus[ServerHandle]) -> None:
                    await serve(
                        ServerConfig(host=host, port=port, faults=faults), task_status=task_status
                    )
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
        except* OSError as group:
            if handle is not None:  # not a failure to bind: let it be seen whole
                raise
            failure = _first_leaf(group)
    if failure is not None:
        reason = getattr(failure, "strerror", None) or str(failure)
        print(f"prohost server: cannot listen on {host}:{port}: {reason}", file=sys.stderr)
        return 1
    return 0
