"""``prohost agent run``: load what the harness needs, then supervise it under signals.

Everything that can be wrong before a socket is opened — no credentials, another
harness on this home, an unreadable ledger — is reported here as one line and exit
status 1, so a daemon's log says what to fix instead of showing a traceback.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import trio
from rich.console import Console

from prohost.engine import lognames, signals
from prohost.engine.agent.process import ProcessGroups, kill_children
from prohost.engine.harness import STOP_WINDOW_S, Harness
from prohost.engine.ledger import Ledger, LedgerError, LedgerUnavailable
from prohost.engine.link.connection import Endpoints
from prohost.engine.report.sender import open_sender
from prohost.engine.supervisor.requests import LOCAL_CANCEL_REASON, obey_requests
from prohost.engine.view.panel import Panel
from prohost.home import (
    LEDGER_FILE,
    CredentialsError,
    InstanceLock,
    LockHeld,
    load_credentials,
    lock_held_message,
    resolve_endpoints,
)
from prohost.logfile import FileLogHandler, add_redaction, log_to_file
from prohost.login_env import log_secrets
from prohost.options import Options
from prohost.startchecks import start_problems

log = logging.getLogger("prohost.agent")
progress_log = logging.getLogger(lognames.RUNS)

#: Space kept beside the ledger so that it can be opened on a full disk: opening a
#: WAL database creates its ``-shm`` index, 32 KiB of real blocks. Random bytes, so
#: that no compressing filesystem stores it in less.
RESERVE_FILE = "ledger.reserve"
RESERVE_BYTES = 32 * 1024

#: ``time.monotonic()`` by which the process must have exited: the second signal's
#: 5 s window (§9); None until a second signal is obeyed.
_stop_deadline: float | None = None


def run_agent_command(
    options: Options, *, console: Console | None = None, live: bool = False
) -> int:
    """Run the harness until it drains or is stopped; return the process exit status.

    With a ``console``, the status panel is drawn on it (``live``) or its changes
    are logged one line each. From here to the process's exit SIGINT/SIGTERM
    follow §9 (see :mod:`prohost.engine.signals`); ``python -m prohost`` installed the
    handlers even earlier, before its imports. Exit status 2 when
    :func:`prohost.startchecks.start_problems` finds a flag every run would fail on.
    """
    # Settings under which every run would fail are refused before anything starts,
    # by the same checks as install-daemon's (issue 31, point 2).
    problems = start_problems(options, os.environ.get("PATH", os.defpath))
    if problems:
        for problem in problems:
            print(f"prohost agent run: error: {problem}", file=sys.stderr)
        return 2
    signals.install()
    code = _run_agent(options, console=console, live=live)
    return signals.final_status(code)


def _run_agent(options: Options, *, console: Console | None, live: bool) -> int:
    main = functools.partial(supervise, console=console, live=live)
    try:
        creds = load_credentials(options.home)
        ws_url, api_base = resolve_endpoints(options.url, creds)
    except (CredentialsError, ValueError) as exc:
        print(f"prohost: {exc}", file=sys.stderr)
        return 1
    _log_to_file(options.home)
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
            ledger = _open_ledger(options.home)
        except LedgerError as exc:
            print(f"prohost: {exc}", file=sys.stderr)
            return 1
        try:
            return trio.run(main, options, endpoints, ledger)
        finally:
            _close_ledger(ledger)
    finally:
        lock.release()


def _log_to_file(home: Path) -> None:
    """Log to the home's rotated file in the foreground too, as the service does
    (``PROHOST_LOG=file`` set it up already then), so ``prohost agent logs`` finds
    every harness's log in one place. The terminal keeps its own lines as well.
    A home where the file cannot be made (read-only, full) still runs: the
    terminal has the log."""
    prohost = logging.getLogger("prohost")
    if any(isinstance(handler, FileLogHandler) for handler in prohost.handlers):
        return
    try:
        log_to_file(home, level=min(logging.INFO, prohost.getEffectiveLevel()))
    except OSError as exc:
        log.warning("cannot write the log file under %s (%s): logging to the terminal only",
                    home, exc.strerror or exc)


def _open_ledger(home: Path) -> Ledger:
    """Open the home's ledger, on a full disk too: a harness started there comes up,
    answers 503 for what it cannot record and recovers when space returns, like one
    that was already running (issue 27). For that it gives the ledger the space its
    reserve kept; the reserve is made again at the next start that has the room.
    With no reserve (a home from before it), the ledger is opened alone, its WAL
    index in memory (:meth:`Ledger.open_alone`).
    """
    reserve = home / RESERVE_FILE
    try:
        ledger = Ledger.open(home / LEDGER_FILE)
    except LedgerUnavailable as exc:
        try:
            reserve.unlink()  # a read-only disk refuses this too: then exc stands
        except FileNotFoundError:
            # No reserve (a home from before it, or a disk that never had room for
            # one): the ledger alone, its WAL index in this process's memory.
            try:
                ledger = Ledger.open_alone(home / LEDGER_FILE)
            except LedgerError:
                raise exc from None
            log.warning("%s; opened it without its shared index instead (until the "
                        "next start, reads wait for a write under way)", exc)
        except OSError:
            raise exc from None
        else:
            log.warning("%s; using the space kept for it (%s)", exc, reserve)
            ledger = Ledger.open(home / LEDGER_FILE)
        log.warning("the disk is full (%s): deliveries the ledger cannot record are "
                    "answered 503 (the server sends them again) until space returns", home)
        return ledger
    _keep_reserve(reserve)
    return ledger


def _keep_reserve(reserve: Path) -> None:
    """Make the ledger's reserve if it is missing; on a disk without the room, say so."""
    try:
        if reserve.stat().st_size >= RESERVE_BYTES:
            return
    except FileNotFoundError:
        pass
    try:
        fd = os.open(reserve, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, os.urandom(RESERVE_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            reserve.unlink()
        log.warning("could not keep %d KiB in reserve for the ledger in %s (%s): if this "
                    "disk fills up, prohost cannot be started on it until it has room",
                    RESERVE_BYTES // 1024, reserve, exc.strerror or exc)


def _close_ledger(ledger: Ledger) -> None:
    """Close the ledger; after a second signal, only for what is left of its window.

    Closing waits for a write under way, and a hung disk can hold that for as long
    as it hangs. Abandoning it is safe: every step is its own transaction, durable
    or not, and the next start reads whatever the file holds (§7). The closing
    thread is a daemon; the stop's watchdog (:func:`_watch_the_stop`) ends the
    process at the window's end whatever it is still doing.
    """
    if _stop_deadline is None:
        ledger.close()
        return
    closer = threading.Thread(target=ledger.close, name="prohost-ledger-close", daemon=True)
    closer.start()
    closer.join(max(0.0, _stop_deadline - time.monotonic()))
    if closer.is_alive():
        log.warning("the run ledger is still busy with a write that does not return (a hung "
                    "disk?); leaving it to the process exit: every step already written "
                    "stays, and the next start reads the rest")
        _exit_now(signals.STOPPED_STATUS)


def _watch_the_stop(groups: ProcessGroups) -> None:
    """Make §9's 5 s hold whatever the disk does: a thread that, at the end of the
    second signal's window, kills every agent (spawned or still being spawned) and
    ends the process at once, even if trio is still waiting for a thread that
    cannot be abandoned (a spawn's ``Popen`` whose child hangs in ``chdir``)."""
    global _stop_deadline
    if _stop_deadline is not None:
        return
    _stop_deadline = time.monotonic() + STOP_WINDOW_S

    def watch() -> None:
        deadline = _stop_deadline or 0.0
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(left)  # a daemon thread's timer, not a wait for an event
        log.error("the stop's %.0f s are over and the harness is still waiting (a hung "
                  "disk or a spawn that does not return?); exiting now: what was not "
                  "reported stays in the ledger for the next start", STOP_WINDOW_S)
        groups.kill_all(signal.SIGKILL)
        _exit_now(signals.STOPPED_STATUS)

    threading.Thread(target=watch, name="prohost-stop-watchdog", daemon=True).start()


def _exit_now(code: int) -> None:
    """End the process with ``code`` at once, agents first (none may outlive it)."""
    kill_children()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


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
    before this (while the process started) are obeyed first, in order. SIGUSR1
    reads the requests ``prohost agent cancel`` left in the home (read once at
    start as well: :mod:`prohost.engine.supervisor.requests`).
    Cancelled: the harness's own cancellation rules apply (see :meth:`Harness.run`).
    """
    async with open_sender(endpoints.api_base) as client:
        harness = Harness(options, endpoints, client=client, ledger=ledger)
        with trio.open_signal_receiver(*signals.WATCHED) as receiver, \
                trio.open_signal_receiver(signals.REQUEST_SIGNAL) as asked:
            # Taken only now: from here on every signal reaches the receiver instead.
            early = signals.take_pending()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_obey_signals, receiver, harness, early)
                if ledger is not None:  # a dry run holds no run to cancel
                    nursery.start_soon(functools.partial(
                        obey_requests, options.home, asked, ready=harness.wait_recovered,
                        cancel=functools.partial(_cancel_asked_here, harness),
                        bounds=harness.bounds))
                if console is not None:
                    _quiet_progress_lines()  # the panel says it instead
                    await nursery.start(Panel(console, harness.snapshot, live=live,
                                                 changes=harness.state_changed).run)
                code = await harness.run()
                nursery.cancel_scope.cancel()
    return code


def _cancel_asked_here(harness: Harness, run_id: str) -> None:
    """``prohost agent cancel``: the server's cancel, from this machine (§6)."""
    harness.cancel(run_id, LOCAL_CANCEL_REASON)


def _quiet_progress_lines() -> None:
    """Quiet the per-run progress lines: the panel logs each change instead, in
    the log file with the live panel and also on the terminal without it, so
    ``agent logs`` says the same either way."""
    progress_log.setLevel(logging.WARNING)


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
        _watch_the_stop(harness.groups)
        harness.stop()
    else:
        log.error("%s a third time: killing every agent and exiting now", name)
        harness.groups.kill_all(signal.SIGKILL)
        logging.shutdown()
        os._exit(signals.STOPPED_STATUS)
