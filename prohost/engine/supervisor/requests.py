"""Requests made on this machine to its running harness: ``prohost agent cancel RUN``.

The command never talks to the harness over a socket. It writes the request as a
file in the home, durably (:func:`ask_cancel`), then signals the harness
(:data:`~prohost.engine.signals.REQUEST_SIGNAL`). The harness reads every pending
request once it is up (its restart recovery done) and again at each signal
(:func:`obey_requests`), cancels each run as a server's cancel would (§6: the same
:meth:`Harness.cancel`), and only then removes the file. So a request is lost
neither to a signal that came while the harness started (it has no default
action then) nor to a ``kill -9`` between the file and the signal: the next start
reads it, and its restart recovery reads it first
(:mod:`prohost.engine.supervisor.recovery`), so that a run that was running is
reported cancelled, not "restarted" and retryable (§6: a cancel is final once the
harness holds it). A request for a run the harness does not hold is ignored and
removed, as a server's cancel of such a run is (§6).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from prohost.engine import lognames
from prohost.engine.blocking import Bounds
from prohost.files import write_atomically
from prohost.wire.runs import valid_run_id

log = logging.getLogger(lognames.HARNESS)

#: The folder of the home that holds the pending requests, one file each.
REQUESTS_DIR = "requests"
CANCEL_PREFIX = "cancel."
#: ``listening.<pid>``: harness ``pid`` reads requests at the signal. A harness of a
#: version before ``agent cancel`` does not, and the signal's default action
#: would end it: without this file, no signal is sent.
LISTENING_PREFIX = "listening."
#: The reason a run cancelled by ``prohost agent cancel`` is reported with (§6:
#: ``"error": "cancelled: <reason>"``).
LOCAL_CANCEL_REASON = "cancelled on its machine (prohost agent cancel)"


def cancel_request(home: Path, run_id: str) -> Path:
    """Where the request to cancel ``run_id`` is kept until the harness obeys it."""
    if not valid_run_id(run_id):
        # Never a path of another folder: the id is the ledger's, checked all the same.
        raise ValueError(f"not a run id: {run_id!r}")
    return home / REQUESTS_DIR / f"{CANCEL_PREFIX}{run_id}"


def ask_cancel(home: Path, run_id: str) -> Path:
    """Record, durably, the request to cancel ``run_id``; the path of its file.
    Raises :class:`OSError` when the home cannot take it."""
    path = cancel_request(home, run_id)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    write_atomically(path, b"")
    return path


def pending_cancels(home: Path) -> list[str]:
    """The runs a request asks to cancel, oldest request first (none: no folder)."""
    try:
        entries = list(os.scandir(home / REQUESTS_DIR))
    except (FileNotFoundError, NotADirectoryError):
        return []
    found: list[tuple[float, str]] = []
    for entry in entries:
        run_id = entry.name.removeprefix(CANCEL_PREFIX)
        # A writer's temporary file starts with "."; anything else is not ours.
        if entry.name.startswith(CANCEL_PREFIX) and valid_run_id(run_id):
            with contextlib.suppress(OSError):
                found.append((entry.stat(follow_symlinks=False).st_mtime, run_id))
    return [run_id for _mtime, run_id in sorted(found)]


def listen(home: Path, pid: int) -> None:
    """Say that harness ``pid`` reads requests at the signal (and forget that any
    earlier process did: a pid may be reused). Blocking; raises :class:`OSError`."""
    folder = home / REQUESTS_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    for entry in os.scandir(folder):
        if entry.name.startswith(LISTENING_PREFIX):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
    write_atomically(folder / f"{LISTENING_PREFIX}{pid}", b"", durable=False)


def listens(home: Path, pid: int) -> bool:
    """Whether harness ``pid`` said it reads requests at the signal (:func:`listen`)."""
    return os.path.lexists(home / REQUESTS_DIR / f"{LISTENING_PREFIX}{pid}")


def answered(home: Path, run_id: str) -> None:
    """The request to cancel ``run_id`` obeyed: its file removed (already gone: fine)."""
    with contextlib.suppress(FileNotFoundError):
        cancel_request(home, run_id).unlink()


async def obey_requests(home: Path, asked: AsyncIterator[int], *,
                        ready: Callable[[], Awaitable[None]],
                        cancel: Callable[[str], None], bounds: Bounds) -> None:
    """Once ``ready`` returns (every run of the ledger held), obey the pending
    requests, then again after each signal ``asked`` yields: ``cancel(run_id)``,
    then the request's file removed.

    Take ``asked`` (the signal receiver) before this is called: only then does it
    say it listens (:func:`listen`), and a signal that came before is covered by
    the first look, made after. A home that cannot be read is logged; the next
    signal looks again. Cancelled: it stops listening; a request not yet obeyed
    stays for the next start.
    """
    try:
        await bounds.file_step(listen, home, os.getpid(), what="saying it reads requests")
    except OSError as exc:
        log.warning("could not say in %s that this harness reads requests (%s): `prohost "
                    "agent cancel` cannot reach it until it is restarted",
                    home / REQUESTS_DIR, exc)
    await ready()
    while True:
        try:
            run_ids = await bounds.file_step(pending_cancels, home, what="reading requests")
        except OSError as exc:
            log.warning("could not read the requests in %s: %s", home / REQUESTS_DIR, exc)
            run_ids = []
        for run_id in run_ids:
            cancel(run_id)
            try:
                await bounds.file_step(answered, home, run_id, what="removing a request")
            except OSError as exc:
                log.warning("could not remove the request to cancel %s: %s", run_id, exc)
        if await _next(asked) is None:
            return


async def _next(asked: AsyncIterator[int]) -> int | None:
    """The next signal, or ``None`` once the receiver has closed."""
    try:
        return await asked.__anext__()
    except StopAsyncIteration:
        return None
