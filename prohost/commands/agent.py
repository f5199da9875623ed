"""``prohost agent run``: load what the harness needs, then supervise it under signals.

Everything that can be wrong before a socket is opened — no credentials, another
harness on this home, an unreadable ledger — is reported here as one line and exit
status 1, so a daemon's log says what to fix instead of showing a traceback.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator

import trio
from rich.console import Console

from prohost.engine import lognames, signals
from prohost.engine.harness import Harness
from prohost.engine.ledger import Ledger, LedgerError
from prohost.engine.link.connection import Endpoints
from prohost.engine.report.sender import open_sender
from prohost.engine.view.panel import Panel
from prohost.home import (
    CredentialsError,
    InstanceLock,
    LockHeld,
    load_credentials,
    lock_held_message,
    resolve_endpoints,
)
from prohost.logfile import add_redaction
from prohost.login_env import log_secrets
from prohost.options import Options

log = logging.getLogger("prohost.agent")
progress_log = logging.getLogger(lognames.RUNS)

LEDGER_FILE = "ledger.sqlite3"


def run_agent_command(
    options: Options, *, console: Console | None = None, live: bool = False
) -> int:
    """Run the harness until it drains or is stopped; return the process exit status.

    With a ``console``, the status panel is drawn on it (``live``) or its changes
    are logged one line each. From here to the process's exit SIGINT/SIGTERM
    follow §9 (see :mod:`prohost.engine.signals`); ``python -m prohost`` installed the
    handlers even earlier, before its imports.
    """
    signals.install()
    code = _run_agent(options, console=console, live=live)
    signals.pause_for_tests()
    return signals.final_status(code)


def _run_agent(options: Options, *, console: Console | None, live: bool) -> int:
    main = functools.partial(supervise, console=console, live=live)
    try:
        creds = load_credentials(options.home)
        ws_url, api_base = resolve_endpoints(options.url, creds)
    except (CredentialsError, ValueError) as exc:
        print(f"prohost: {exc}", file=sys.stderr)
        return 1
    # Every handler is in place by now; from here on neither secret can reach a log,
    # nor the agent CLIs' logins the service passes on (an API key in an error line).
    add_redaction(creds.token, creds.secret, *log_secrets(os.environ))
    endpoints = Endpoints(ws_url=ws_url, api_base=api_base, token=creds.token,
                          secret=creds.secret)
    if options.dry_run:
        # A dry run writes nothing but its log: no lock file, no ledger.
        return trio.run(main, options, endpoints, None)
    try:
        lock = InstanceLock.acquire(options.home)
    except LockHeld as exc:
        print(lock_held_message(exc, options.home), file=sys.stderr)
        return 1
    except OSError as exc:
        # A full or read-only disk: say so, as for the ledger below, not a traceback.
        print(f"prohost: cannot set up its home {options.home} (folders, lock file): "
              f"{exc.strerror or exc}; is the disk full or read-only?", file=sys.stderr)
        return 1
    try:
        try:
            ledger = Ledger.open(options.home / LEDGER_FILE)
        except LedgerError as exc:
            print(f"prohost: {exc}", file=sys.stderr)
            return 1
        try:
            return trio.run(main, options, endpoints, ledger)
        finally:
            ledger.close()
    finally:
        lock.release()


async def supervise(
    options: Options,
    endpoints: Endpoints,
    ledger: Ledger | None,
    *,
    console: Console | None = None,
    live: bool = False,
) -> int:
    """The harness under §9's signal rules; returns the exit status.

    First SIGINT/SIGTERM drains, the second stops every agent (exit 130 within
    5 s), the third kills every agent group and exits at once. Signals that came
    before this (while the process started) are obeyed first, in order.
    Cancelled: the harness's own cancellation rules apply (see :meth:`Harness.run`).
    """
    async with open_sender() as client:
        harness = Harness(options, endpoints, client=client, ledger=ledger)
        with trio.open_signal_receiver(*signals.WATCHED) as receiver:
            # Taken only now: from here on every signal reaches the receiver instead.
            early = signals.take_pending()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_obey_signals, receiver, harness, early)
                if console is not None:
                    progress_log.setLevel(logging.WARNING)  # the panel says it instead
                    await nursery.start(Panel(console, harness.snapshot, live=live,
                                                 changes=harness.state_changed).run)
                code = await harness.run()
                nursery.cancel_scope.cancel()
    return code


async def _obey_signals(
    receiver: AsyncIterator[int], harness: Harness, early: list[tuple[int, int]]
) -> None:
    """Obey the signals that came before the supervisor, then every later one.

    Cancelled: it only stops listening (the harness has finished by then).
    """
    for count, signum in early:
        _obey(count, signum, harness, early=True)
    async for signum in receiver:
        _obey(signals.note(signum), signum, harness, early=False)


def _obey(count: int, signum: int, harness: Harness, *, early: bool) -> None:
    name = signal.Signals(signum).name
    if early:
        name += " (received while starting)"
    if count == 1:
        log.info("%s: draining (send it again to stop the running agents)", name)
        harness.drain()
    elif count == 2:
        log.warning("%s again: stopping the running agents", name)
        harness.stop()
    else:
        log.error("%s a third time: killing every agent and exiting now", name)
        harness.groups.kill_all(signal.SIGKILL)
        logging.shutdown()
        os._exit(signals.STOPPED_STATUS)
