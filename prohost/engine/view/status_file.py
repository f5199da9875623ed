"""What the harness says about itself: its ``status`` message (§2), its
:class:`~prohost.engine.view.snapshot.Snapshot` of this moment, the task that keeps
``$PROHOST_HOME/status.json`` current from it (for ``agent status``), and the
latest finished runs they show.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from prohost import __version__
from prohost.engine.run.heldrun import HeldRun
from prohost.engine.run.runner import progress_log
from prohost.engine.view.snapshot import (
    REFRESH_S,
    STATUS_FILE,
    Connection,
    FinishedRow,
    RunRow,
    Snapshot,
    write_snapshot,
)
from prohost.wire.protocol import AccountRow, RunBeat, Status
from prohost.wire.runs import Outcome

if TYPE_CHECKING:
    from prohost.engine.harness import Harness

log = logging.getLogger("prohost.harness")

#: status.json is rewritten at most this often (seconds).
STATUS_FILE_MIN_INTERVAL_S = 1.0
#: Bounds on writing and on removing status.json (s): a write that takes longer is
#: abandoned (the disk is hung) and tried again at the next change.
STATUS_FILE_WRITE_S = 10.0
STATUS_FILE_REMOVE_S = 2.0


def note_outcome(harness: Harness, held: HeldRun, outcome: Outcome) -> None:
    """A run has its outcome and is about to be reported: log it, and keep it among
    the latest finished runs the panel and ``agent status`` show."""
    run = held.run
    if outcome.ok:
        progress_log.info("✓ run %s finished", run.run_id)
    else:
        progress_log.info("✗ run %s failed: %s", run.run_id, outcome.error)
    if held.progress.model:
        harness.model = held.progress.model
    harness.finished.appendleft(FinishedRow(
        run_id=run.run_id, conversation=run.conversation_id, ok=outcome.ok,
        error=outcome.error,
        duration_s=None if outcome.duration_ms is None else outcome.duration_ms / 1000,
        finished_at=time.time(),
    ))
    harness.changed()


def take_snapshot(harness: Harness) -> Snapshot:
    """A frozen picture of this moment, for the panel and ``agent status``."""
    now = trio.current_time()
    link = harness.link.statistics()
    connection: Connection
    if harness.stopping:
        connection = "stopping"
    elif harness.draining:
        connection = "draining"
    elif link.connected:
        connection = "connected"
    elif link.failures:
        connection = "reconnecting"
    else:
        connection = "connecting"
    stats = harness.scheduler.statistics()
    rows = []
    for held in harness.held.values():
        if held.state == "queued" and held.waiting_until is None:
            continue
        started = held.started_at
        idle_left = None
        last = held.progress.last_output
        if held.state == "running" and last is not None and harness.options.idle_timeout_s > 0:
            idle_left = max(0.0, last + harness.options.idle_timeout_s - now)
        rows.append(RunRow(
            run_id=held.run_id, lane=held.lane, conversation=held.conversation_id,
            state=held.state,
            elapsed_s=None if started is None else max(0.0, time.time() - started),
            activity=held.beat().activity, idle_left_s=idle_left,
        ))
    return Snapshot(
        taken_at=time.time(),
        pid=os.getpid(),
        version=__version__,
        connection=connection,
        server=harness.endpoints.ws_url,
        machine=harness.options.machine,
        brain=harness.brain.name,
        brain_version=harness.brain_version,
        model=harness.model,
        slots=stats.limit,
        slots_used=stats.running,
        queued=stats.queued,
        reconnect_in_s=None if link.reconnect_at is None
        else max(0.0, link.reconnect_at - now),
        last_error=link.last_error,
        heartbeat_age_s=None if harness.beacon.last_heartbeat_at is None or not link.connected
        else now - harness.beacon.last_heartbeat_at,
        runs=tuple(rows),
        finished=tuple(harness.finished),
        accounts=tuple(account_rows(harness)),
        reports_waiting=0 if harness.runner is None else len(harness.runner.outbox),
        reports_waiting_since=None if harness.runner is None
        else harness.runner.outbox.oldest(),
    )


async def keep_status_file(harness: Harness) -> None:
    """Keep ``$PROHOST_HOME/status.json`` current: on every change, at most once a
    second, and every few seconds regardless (its age says the harness is alive).

    Cancelled: the file is removed (shielded, bounded), so ``agent status`` says
    plainly that no harness is running. Every write and the removal are bounded by
    ``harness.bounds`` (hurried by the second signal), so a hung disk never holds
    the harness's exit.
    """
    home = harness.options.home
    # One thread at most: a write a hung disk left behind holds the token, so the
    # next ones time out waiting for it instead of piling up threads.
    writer = trio.CapacityLimiter(1)
    try:
        while True:
            snapshot = take_snapshot(harness)
            try:
                # Abandoning is safe: a write to a temporary file and a rename
                # over status.json; at worst a stale picture is left, which
                # `agent status` tells by its age and pid.
                await harness.bounds.file_step(write_snapshot, home, snapshot,
                                               limit_s=STATUS_FILE_WRITE_S, limiter=writer,
                                               what=f"writing {home / STATUS_FILE}")
            except OSError as exc:
                log.warning("could not write %s: %s", home / STATUS_FILE, exc)
            harness.status_written.set()
            harness.status_written = trio.Event()
            await trio.sleep(STATUS_FILE_MIN_INTERVAL_S)
            # Elapsed times move while runs execute; otherwise only changes matter.
            with trio.move_on_after(
                STATUS_FILE_MIN_INTERVAL_S if snapshot.runs else REFRESH_S
            ):
                await harness.state_changed.wait()
    finally:
        # Shielded by Bounds.run, and bounded (by the second signal's deadline too).
        with contextlib.suppress(OSError):
            await harness.bounds.file_step(_remove_quietly, home / STATUS_FILE,
                                           limit_s=STATUS_FILE_REMOVE_S, limiter=writer,
                                           what=f"removing {home / STATUS_FILE}")


def status_message(harness: Harness) -> Status:
    """The ``status`` message (§2) as of now."""
    stats = harness.scheduler.statistics()
    return Status(
        version=__version__,
        machine=harness.options.machine,
        brain=harness.brain.name,
        brain_version=harness.brain_version,
        model=harness.model,
        concurrency=harness.options.concurrency,
        active=stats.running,
        queued=stats.queued,
        draining=harness.draining,
        features=["cancel", "timeline"] if harness.brain.streams else ["cancel"],
        accounts=account_rows(harness),
    )

def heartbeat_runs(harness: Harness) -> list[RunBeat]:
    """A heartbeat's ``runs`` (§2): every run held, then every report waiting in
    the outbox, still ``reporting`` to the server until it settles (§7)."""
    beats = [held.beat() for held in harness.held.values()]
    if harness.runner is not None and len(harness.runner.outbox):
        beats.extend(beat for beat in harness.runner.outbox.beats()
                     if beat.run_id not in harness.held)
    return beats


def account_rows(harness: Harness) -> list[AccountRow]:
    """``status.accounts`` (§12), as of now."""
    return [AccountRow(**row) for row in harness.book.snapshot(harness.clock())]


def _remove_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
