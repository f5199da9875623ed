"""``prohost server``: run the reference server in the foreground until a signal."""

from __future__ import annotations

import errno
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import trio

from prohost.invocation import command
from prohost.server import ServerConfig, ServerHandle, StateError, serve
from prohost.server.pairings import pairings_path


def _banner(handle: ServerHandle, state_is_default: bool) -> str:
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
    token_file = handle.state.api_token_file
    assert token_file is not None  # run_server_command always gives it a folder
    token = (f"  API token:    {token_file} (sending and cancelling runs need it"
             + ("" if state_dir is not None else "; removed when the server stops") + ")")
    # `prohost send` looks in $PROHOST_HOME/server unless told where the token is.
    where = [] if state_is_default else ["--state", str(token_file.parent)]
    return "\n".join(
        [
            "prohost reference server",
            f"  pairing code: {handle.pairing_code}",
            kept,
            token,
            f"  WebSocket:    {handle.ws_url}",
            f"  HTTP:         {handle.http_url}",
            *faults,
            "Pair a harness with (a code works once; the log shows the next one):",
            "  " + command("agent", "pair", "--code", handle.pairing_code, "--url",
                           handle.ws_url),
            "Send a request to it (once a harness runs) with:",
            "  " + command("send", "--server", handle.http_url, *where, "--wait", "hello"),
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
    state_is_default: bool = False,
) -> int:
    """Serve on ``host:port`` until SIGINT/SIGTERM; a second signal stops at once.
    ``faults`` serves the soak's fault hooks (:mod:`prohost.server.faults`);
    ``state_dir`` keeps the pairings and the API token across restarts (None: a
    private temporary folder holds the token, removed at the end);
    ``state_is_default``: it is where ``prohost send`` looks without ``--state``.
    ``retries`` is how often a retryable failure is submitted again.

    Cancelled: the server stops at once, without close frames (the temporary
    folder is removed all the same).
    """
    if state_dir is not None:
        return await _run_server(host, port, faults, state_dir, retries, state_dir,
                                 state_is_default)
    # mkdtemp makes it 0700; under bubblewrap a run never sees the person's /tmp.
    token_dir = Path(tempfile.mkdtemp(prefix="prohost-server-"))
    try:
        return await _run_server(host, port, faults, None, retries, token_dir, False)
    finally:
        shutil.rmtree(token_dir, ignore_errors=True)


async def _run_server(
    host: str, port: int, faults: bool, state_dir: Path | None, retries: int,
    token_dir: Path, state_is_default: bool,
) -> int:
    """:func:`run_server_command` with the token's folder chosen. Cancelled: as it."""
    failure: BaseException | None = None
    unusable: BaseException | None = None
    handle: ServerHandle | None = None
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        try:
            async with trio.open_nursery() as nursery:

                async def serve_then_stop(*, task_status: trio.TaskStatus[ServerHandle]) -> None:
                    config = ServerConfig(
                        host=host, port=port, faults=faults, state_dir=state_dir,
                        retries=retries, token_dir=token_dir,
                    )
                    await serve(config, task_status=task_status)
                    nursery.cancel_scope.cancel()

                started: ServerHandle = await nursery.start(serve_then_stop)
                handle = started
                print(_banner(started, state_is_default), flush=True)
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
