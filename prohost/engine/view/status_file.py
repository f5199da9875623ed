"""What the harness says about itself: its ``status`` message (§2), its
:class:`~prohost.engine.view.snapshot.Snapshot` of this moment, the task that keeps
``$PROHOST_HOME/status.json`` current from it (for ``agent status``), and the
latest finished runs they show.

None of it takes the supervisor: the composition root hands over an
:class:`Observed` (the parts a picture is read from, each read-only here) and the
:class:`Facts` this module keeps (what the harness has learnt about itself).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs
import trio

from prohost import __version__
from prohost.engine import lognames
from prohost.engine.accounts.book import AccountBook
from prohost.engine.accounts.spend import DailySpend, SpendRow
from prohost.engine.agent.brains.base import Brain
from prohost.engine.blocking import Bounds
from prohost.engine.changes import Changes
from prohost.engine.lanes.scheduler import SchedulerStatistics
from prohost.engine.link.connection import LinkStatistics
from prohost.engine.report.outbox import Outbox
from prohost.engine.run.heldrun import HeldRun, Phase
from prohost.engine.run.progress import Progress
from prohost.engine.view.reporttext import changes_summary, where_text
from prohost.engine.view.snapshot import (
    REFRESH_S,
    STATUS_FILE,
    Connection,
    FinishedRow,
    RunRow,
    Snapshot,
    write_snapshot,
)
from prohost.options import Options
from prohost.wire.protocol import AccountRow, RunBeat, Status, converter
from prohost.wire.runs import Outcome, conversation_of
from prohost.wire.usage import Usage

log = logging.getLogger(lognames.HARNESS)
progress_log = logging.getLogger(lognames.RUNS)

#: status.json is rewritten at most this often (seconds).
STATUS_FILE_MIN_INTERVAL_S = 1.0
#: Bounds on writing and on removing status.json (s): a write that takes longer is
#: abandoned (the disk is hung) and tried again at the next change.
STATUS_FILE_WRITE_S = 10.0
STATUS_FILE_REMOVE_S = 2.0
#: The panel and status file show this many of the latest finished runs.
FINISHED_KEPT = 5


@attrs.define(eq=False)
class Facts:
    """What the harness has learnt about itself while it runs: the agent CLI's
    version (asked once at start), the model the latest run used, and the latest
    finished runs. Written here and by the version probe; read by every view."""

    #: Said when a fact changes (the status message and the panel look again).
    on_change: Callable[[], None]
    model: str | None = None
    #: The mode the latest run's agent was in (an ACP session's).
    mode: str | None = None
    brain_version: str | None = None
    finished: collections.deque[FinishedRow] = attrs.field(
        factory=lambda: collections.deque(maxlen=FINISHED_KEPT))
    #: Today's runs, tokens and cost per account.
    spend: DailySpend = attrs.field(factory=DailySpend)

    def learned_version(self, version: str) -> None:
        self.brain_version = version
        self.on_change()

    def note_outcome(self, run_id: str, lane: str, progress: Progress,
                     outcome: Outcome) -> None:
        """Run ``run_id`` of ``lane`` has its outcome and is about to be reported: log
        it, and keep it among the latest finished runs the panel and ``agent status``
        show (with the model and mode its ``progress`` saw). The runner announces
        the change (it moves the run to ``reporting`` next)."""
        if outcome.ok:
            progress_log.info("✓ run %s finished", run_id)
        else:
            progress_log.info("✗ run %s failed: %s", run_id, outcome.error)
        if progress.model:
            self.model = progress.model
        self.mode = progress.mode or self.mode
        now = time.time()
        usage = outcome.usage or Usage()
        tokens = None if usage.input_tokens is None and usage.output_tokens is None \
            else (usage.input_tokens or 0) + (usage.output_tokens or 0)
        self.finished.appendleft(FinishedRow(
            run_id=run_id, conversation=conversation_of(lane), ok=outcome.ok,
            error=outcome.error,
            duration_s=None if outcome.duration_ms is None else outcome.duration_ms / 1000,
            # The few words are read from the §7 JSON, as for any report.
            finished_at=now, changes=_changes_text(converter.unstructure(outcome.changes)),
            tokens=tokens,
            cost_usd=usage.cost_usd,
        ))
        if outcome.account is not None:  # an agent ran: it counts in today's spend
            self.spend.add(outcome.account, outcome.usage, now)
        # Not announced here: the runner moves the run to "reporting" right after,
        # and that one change notice covers both.


def _changes_text(changes: object) -> str | None:
    """``1 file (+3 −0), 1 commit in app on prohost/conv-1 at 1a2b3c4d5e6f``: what
    a run changed and where that work now is, for the reply line (panel and log)."""
    summary = changes_summary(changes)
    where = where_text(changes)
    return summary if summary is None or where is None else f"{summary} in {where}"


@attrs.frozen(eq=False)
class Observed:
    """The parts a picture of the harness is read from; nothing here changes them."""

    options: Options
    #: The server's WebSocket address, as shown.
    server: str
    brain: Brain
    facts: Facts
    runs: Mapping[str, HeldRun]
    book: AccountBook
    #: Epoch seconds, for the accounts' resets (§12).
    clock: Callable[[], float]
    link: Callable[[], LinkStatistics]
    scheduler: Callable[[], SchedulerStatistics]
    #: trio time of the last heartbeat sent, if any.
    last_heartbeat_at: Callable[[], float | None]
    draining: Callable[[], bool]
    stopping: Callable[[], bool]
    #: Reports waiting past their window (§7); ``None`` in a dry run.
    outbox: Outbox | None = None
    #: ``confined (Landlock ABI 7)`` or ``NOT confined: <reason>`` (§13).
    confinement: str | None = None


def take_snapshot(seen: Observed) -> Snapshot:
    """A frozen picture of this moment, for the panel and ``agent status``."""
    now = trio.current_time()
    link = seen.link()
    connection: Connection
    if seen.stopping():
        connection = "stopping"
    elif seen.draining():
        connection = "draining"
    elif link.connected:
        connection = "connected"
    elif link.failures:
        connection = "reconnecting"
    else:
        connection = "connecting"
    stats = seen.scheduler()
    idle_timeout_s = seen.options.idle_timeout_s
    rows = []
    for held in seen.runs.values():
        if held.state is Phase.QUEUED and held.waiting_until is None:
            continue
        started = held.started_at
        quiet = None
        last = held.progress.last_output
        if held.state is Phase.RUNNING and last is not None:
            quiet = max(0.0, now - last)
        rows.append(RunRow(
            run_id=held.run_id, lane=held.lane, conversation=held.conversation_id,
            state=held.state,
            elapsed_s=None if started is None else max(0.0, time.time() - started),
            activity=held.beat().activity, quiet_s=quiet,
            idle_limit_s=idle_timeout_s if idle_timeout_s > 0 else None,
        ))
    last_heartbeat_at = seen.last_heartbeat_at()
    return Snapshot(
        taken_at=time.time(),
        pid=os.getpid(),
        version=__version__,
        connection=connection,
        server=seen.server,
        machine=seen.options.machine,
        brain=seen.brain.name,
        brain_version=seen.facts.brain_version,
        model=seen.facts.model,
        mode=seen.facts.mode,
        confinement=seen.confinement,
        slots=stats.limit,
        slots_used=stats.running,
        queued=stats.queued,
        reconnect_in_s=None if link.reconnect_at is None
        else max(0.0, link.reconnect_at - now),
        last_error=link.last_error,
        heartbeat_age_s=None if last_heartbeat_at is None or not link.connected
        else now - last_heartbeat_at,
        runs=tuple(rows),
        finished=tuple(seen.facts.finished),
        accounts=tuple(account_rows(seen.book, seen.clock)),
        reports_waiting=0 if seen.outbox is None else len(seen.outbox),
        reports_waiting_since=None if seen.outbox is None else seen.outbox.oldest(),
        spend_today=_spend_rows(seen.facts.spend.rows(time.time())),
    )


def _spend_rows(rows: list[SpendRow]) -> tuple[SpendRow, ...]:
    """Today's rows for the snapshot: the all-accounts row (``account`` null) only
    when there are several accounts; with one it repeated that account's numbers,
    and ``agent status --json`` read as two spends (issue 31, point 11)."""
    accounts = [row for row in rows if row.account is not None]
    return tuple(accounts if len(accounts) == 1 else rows)


async def keep_status_file(take: Callable[[], Snapshot], *, changes: Changes,
                           home: Path, bounds: Bounds) -> None:
    """Keep ``home/status.json`` current with ``take()``: on every change, at most
    once a second, and every few seconds regardless (its age says the harness is
    alive).

    Cancelled: the file is removed (shielded, bounded), so ``agent status`` says
    plainly that no harness is running. Every write and the removal are bounded by
    ``bounds`` (hurried by the second signal), so a hung disk never holds the
    harness's exit.
    """
    # One thread at most: a write a hung disk left behind holds the token, so the
    # next ones time out waiting for it instead of piling up threads.
    writer = trio.CapacityLimiter(1)
    try:
        while True:
            # Counted before the picture: a change from here on (while writing, or
            # during the pause after) makes the next write right after the pause.
            # Waiting for the next notice only then missed it for REFRESH_S (a
            # harness that had just connected and run a run still showed
            # "connecting" to `agent status`; issue 31, point 8).
            since = changes.seen()
            snapshot = take()
            try:
                # Abandoning is safe: a write to a temporary file and a rename
                # over status.json; at worst a stale picture is left, which
                # `agent status` tells by its age and pid.
                await bounds.file_step(write_snapshot, home, snapshot,
                                       limit_s=STATUS_FILE_WRITE_S, limiter=writer,
                                       what=f"writing {home / STATUS_FILE}")
            except OSError as exc:
                log.warning("could not write %s: %s", home / STATUS_FILE, exc)
            await trio.sleep(STATUS_FILE_MIN_INTERVAL_S)
            # Elapsed times move while runs execute; otherwise only changes matter.
            with trio.move_on_after(
                STATUS_FILE_MIN_INTERVAL_S if snapshot.runs else REFRESH_S
            ):
                await changes.wait_since(since)
    finally:
        # Shielded by Bounds.run, and bounded (by the second signal's deadline too).
        with contextlib.suppress(OSError):
            await bounds.file_step(_remove_quietly, home / STATUS_FILE,
                                   limit_s=STATUS_FILE_REMOVE_S, limiter=writer,
                                   what=f"removing {home / STATUS_FILE}")


def status_message(seen: Observed) -> Status:
    """The ``status`` message (§2) as of now."""
    stats = seen.scheduler()
    return Status(
        version=__version__,
        machine=seen.options.machine,
        brain=seen.brain.name,
        brain_version=seen.facts.brain_version,
        model=seen.facts.model,
        mode=seen.facts.mode,
        concurrency=seen.options.concurrency,
        active=stats.running,
        queued=stats.queued,
        draining=seen.draining(),
        features=["cancel", "timeline"] if seen.brain.streams else ["cancel"],
        accounts=account_rows(seen.book, seen.clock),
    )


def heartbeat_runs(runs: Mapping[str, HeldRun], outbox: Outbox | None) -> list[RunBeat]:
    """A heartbeat's ``runs`` (§2): every run held, then every report waiting in
    the outbox, still ``reporting`` to the server until it settles (§7)."""
    beats = [held.beat() for held in runs.values()]
    if outbox is not None and len(outbox):
        beats.extend(beat for beat in outbox.beats() if beat.run_id not in runs)
    return beats


def account_rows(book: AccountBook, clock: Callable[[], float]) -> list[AccountRow]:
    """``status.accounts`` (§12), as of now."""
    return [AccountRow(**row) for row in book.snapshot(clock())]


def _remove_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
