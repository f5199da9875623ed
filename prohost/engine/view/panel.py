"""The live status panel, and the plain-log fallback when there is no terminal.

Everything here draws a :class:`~prohost.engine.view.snapshot.Snapshot`: one frozen instant of
the harness, so a frame can never show a run both queued and running. ``render``
is pure (the same snapshot and ``now`` always give the same picture), which is
what lets ``prohost agent status`` print exactly what the panel shows.

The panel never starts a thread: rich's ``Live`` auto-refresh would, so it runs
with ``auto_refresh=False`` and a trio task refreshes it: at a change notice, a
clock's tick (once a second) or, while runs execute, every LIVE_REFRESH_S, and
only when the picture differs (:func:`shown`), so an idle harness costs next to
nothing on a terminal. Log lines print above the panel only if the logging
handler is a ``RichHandler`` on the *same* console (:func:`prohost.logfile.log_handler`); any
other handler writing to the terminal tears the frame. ``agent run`` gives the panel a console over
:func:`prohost.engine.view.termout.nonblocking` stdout, so a terminal that stops reading drops
frames instead of stalling the event loop. The words both views share (durations,
hosts, accounts) are :mod:`prohost.engine.view.statustext`; the plain log's lines
are :mod:`prohost.engine.view.changelines`.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Sequence

import attrs
import trio
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from prohost.engine.changes import Changes
from prohost.engine.view.changelines import describe_change, did_text
from prohost.engine.view.snapshot import Connection, FinishedRow, RunRow, Snapshot
from prohost.engine.view.statustext import (
    RUN_ID_SHOWN,
    accounts_line,
    brain_line,
    clean,
    compact_duration,
    server_host,
    short_ago,
    short_run_id,
    spend_line,
    waiting_reports_text,
)
from prohost.invocation import command
from prohost.logfile import FILE_ONLY

log = logging.getLogger("prohost.panel")

#: The live panel draws at most this often, and looks this often while runs execute
#: (their activity changes without a change notice).
LIVE_REFRESH_S = 0.25
#: How often it looks otherwise: every clock it shows (elapsed, heartbeat age,
#: countdowns, "… ago") moves in whole seconds.
CLOCK_TICK_S = 1.0
#: How often the plain-log fallback looks for changes.
PLAIN_POLL_S = 1.0
#: How many finished runs the panel lists (the snapshot may hold more).
RECENT_SHOWN = 3


def _label(conversation: str | None, run_id: str) -> str:
    """The conversation, or for a run outside any conversation (a ``run:…`` lane) its
    id, as short as the runs table shows it."""
    return clean(conversation) if conversation else short_run_id(run_id)


def _aged(value: float | None, by: float) -> float | None:
    return None if value is None else value + by


def _counted(value: float | None, by: float) -> float | None:
    return None if value is None else max(0.0, value - by)


def _status_text(snapshot: Snapshot, drift: float) -> Text:
    connection = snapshot.connection
    if connection == "connected":
        return Text("● connected", style="bold green")
    if connection == "connecting":
        return Text("○ connecting", style="bold yellow")
    if connection == "reconnecting":
        countdown = _counted(snapshot.reconnect_in_s, drift)
        # Rounded up: "in 0 s" while a wait is still pending would read as "now".
        when = "" if countdown is None else f" in {compact_duration(math.ceil(countdown))}"
        return Text(f"↻ reconnecting{when}", style="bold yellow")
    if connection == "draining":
        return Text("◐ draining", style="bold cyan")
    if connection == "stopping":
        return Text("■ stopping", style="bold red")
    if connection == "drained":
        return Text("✓ drained", style="bold green")
    return Text(f"■ {connection}", style="bold red")


def _header(snapshot: Snapshot, drift: float) -> RenderableType:
    line = _status_text(snapshot, drift)
    line.append(f" · {server_host(snapshot.server)} · machine {snapshot.machine}"
                f" · {brain_line(snapshot)}")
    # One line at any width: what matters most is first, so the cut loses the least.
    line.no_wrap = True
    line.overflow = "ellipsis"
    return line


def _counts(snapshot: Snapshot, drift: float) -> Text:
    parts = [f"slots {snapshot.slots_used}/{snapshot.slots}", f"queued {snapshot.queued}"]
    age = _aged(snapshot.heartbeat_age_s, drift)
    if snapshot.connection == "connected" and age is None:
        parts.append("no heartbeat yet")
    elif snapshot.connection in ("connected", "draining", "stopping") and age is not None:
        # A drain closes the connection at its end: then there is no heartbeat to age.
        parts.append(f"heartbeat {compact_duration(age)} ago")
    parts.append(f"pid {snapshot.pid}")
    parts.append(f"prohost {snapshot.version}")
    return Text(" · ".join(parts), style="dim", no_wrap=True, overflow="ellipsis")


#: The note under the header once the harness stops taking runs, by its state.
_ENDING_NOTES = {
    "stopping": ("stopping the running agents", "red"),
    "drained": ("exited: every run it took has finished", "green"),
    "stopped": ("exited: the agents still running were stopped", "red"),
    "exited": ("exited (its log says why)", "red"),
}


def _line(text: str, style: str) -> Text:
    """One note: a single line, cut rather than wrapped."""
    return Text(text, style=style, no_wrap=True, overflow="ellipsis")


def _notes(snapshot: Snapshot, now: float, *, here: bool) -> list[RenderableType]:
    notes: list[RenderableType] = []
    waiting = waiting_reports_text(snapshot.reports_waiting, snapshot.reports_waiting_since,
                                   now)
    if waiting is not None:
        notes.append(_line(f"⚠ {waiting}; retried every 5 min", "yellow"))
    if snapshot.confinement is not None:
        confined = snapshot.confinement.startswith("confined")
        notes.append(_line(snapshot.confinement, "dim") if confined
                     else _line(f"⚠ {snapshot.confinement}", "yellow"))
    if snapshot.connection in ("reconnecting", "connecting") and snapshot.last_error:
        notes.append(_line(f"last error: {clean(snapshot.last_error)}", "yellow"))
    if snapshot.connection == "draining":
        # Ctrl-C only means something in the harness's own terminal.
        how = "Ctrl-C again" if here else f"`{command('agent', 'stop', '--now')}`"
        # Wrapped, not cut: the command (a long path, maybe) must be whole to run.
        notes.append(Text(f"finishing its runs, taking no new ones; {how} stops them",
                          style="cyan"))
    elif snapshot.connection in _ENDING_NOTES:
        notes.append(_line(*_ENDING_NOTES[snapshot.connection]))
    return notes


_STATE_STYLE = {"running": "green", "preparing": "yellow", "reporting": "cyan"}


def _runs_table(runs: Sequence[RunRow], drift: float) -> Table:
    # Fixed widths for the short columns leave the rest to the activity, which is
    # the one that is cut: rich shrinks only what does not fit, and no column wraps.
    # No box: column rules cost three cells a column, which the activity needs more.
    # An agent that says nothing of what it does (a plain command) has no activity
    # column at all: empty, it would take most of a wide window.
    active = any(row.activity for row in runs)
    table = Table(box=None, show_edge=False, pad_edge=False, expand=active, padding=(0, 1),
                  header_style="bold underline")
    table.add_column("conversation", no_wrap=True, overflow="ellipsis", max_width=14)
    table.add_column("run", no_wrap=True, overflow="ellipsis", max_width=RUN_ID_SHOWN)
    table.add_column("state", no_wrap=True, width=9)
    table.add_column("elapsed", no_wrap=True, justify="right", width=7)
    if active:
        table.add_column("activity", no_wrap=True, overflow="ellipsis", ratio=1, min_width=8)
    # How long the agent has printed nothing: a run that goes quiet is stopped once
    # this reaches --idle-timeout (shown in yellow in its last minute).
    table.add_column("quiet", no_wrap=True, justify="right", width=6)
    for row in runs:
        elapsed = _aged(row.elapsed_s, drift)
        quiet = _aged(row.quiet_s, drift)
        near = quiet is not None and row.idle_limit_s is not None \
            and row.idle_limit_s - quiet < 60
        cells: list[RenderableType] = [
            # A run outside any conversation is its own lane: the run column names it.
            Text(clean(row.conversation)) if row.conversation else Text("—", style="dim"),
            Text(short_run_id(row.run_id), style="dim"),
            Text(row.state, style=_STATE_STYLE.get(row.state, "")),
            "—" if elapsed is None else compact_duration(elapsed),
        ]
        if active:
            cells.append(Text(clean(row.activity or ""), style="dim"))
        cells.append(Text("" if quiet is None else compact_duration(quiet),
                          style="bold yellow" if near else ""))
        table.add_row(*cells)
    return table


def _recent(finished: Sequence[FinishedRow], now: float) -> Table:
    table = Table(box=None, show_header=False, show_edge=False, pad_edge=False, expand=True,
                  padding=(0, 1))
    table.add_column(no_wrap=True, width=1)
    table.add_column(no_wrap=True, overflow="ellipsis", max_width=14)
    table.add_column(no_wrap=True, justify="right", width=6)
    table.add_column(no_wrap=True, justify="right", width=10)
    table.add_column(no_wrap=True, overflow="ellipsis", ratio=1)
    for row in finished[:RECENT_SHOWN]:
        table.add_row(
            Text("✓", style="green") if row.ok else Text("✗", style="red"),
            _label(row.conversation, row.run_id),
            "" if row.duration_s is None else compact_duration(row.duration_s),
            Text(f"{short_ago(now - row.finished_at)} ago", style="dim"),
            Text(clean(row.error or "failed"), style="red") if not row.ok
            else Text(_did(row), style="dim"),
        )
    return table


#: What a run did (its changes, tokens and cost): the plain log says the same.
_did = did_text


def render(snapshot: Snapshot, *, now: float | None = None,
           here: bool = False) -> RenderableType:
    """The panel's picture of ``snapshot``.

    ``now`` (wall-clock seconds) ages the snapshot's clocks to that moment:
    elapsed and heartbeat ages grow, countdowns shrink. By default the picture
    is of the instant the snapshot was taken. ``here``: drawn in the harness's
    own terminal (where Ctrl-C reaches it), not by ``agent status``.
    """
    current = snapshot.taken_at if now is None else now
    # A snapshot read from disk is up to a few seconds old; never age it backwards.
    drift = max(0.0, current - snapshot.taken_at)
    parts: list[RenderableType] = [_header(snapshot, drift), _counts(snapshot, drift)]
    accounts = accounts_line(snapshot.accounts)
    if accounts is not None:
        limited = any(row.state == "limited" for row in snapshot.accounts)
        parts.append(Text(accounts, style="yellow" if limited else "",
                          no_wrap=True, overflow="ellipsis"))
    spend = spend_line(snapshot.spend_today)
    if spend is not None:
        parts.append(Text(spend, style="dim", no_wrap=True, overflow="ellipsis"))
    parts.extend(_notes(snapshot, current, here=here))
    parts.append(Text(""))
    if snapshot.runs:
        parts.append(_runs_table(snapshot.runs, drift))
    elif snapshot.connection in ("draining", "stopping", "drained", "stopped", "exited"):
        parts.append(Text("no runs left", style="dim"))
    else:
        parts.append(Text("waiting for runs", style="dim"))
    if snapshot.finished:
        parts.append(Text(""))
        parts.append(Text("recent", style="bold"))
        parts.append(_recent(snapshot.finished, current))
    return Group(*parts)


def finished(snapshot: Snapshot) -> Snapshot:
    """``snapshot`` as the harness's last picture, once it has finished: a drain
    that ended says so, as does a stop, and no clock of a closed connection is
    left running ("draining … no heartbeat yet" would be untrue by then)."""
    ended: Connection = "exited"
    if snapshot.connection in ("draining", "drained"):
        ended = "drained"
    elif snapshot.connection in ("stopping", "stopped"):
        ended = "stopped"
    return attrs.evolve(snapshot, connection=ended, heartbeat_age_s=None,
                        reconnect_in_s=None)


def _whole(seconds: float | None) -> int | None:
    return None if seconds is None else math.floor(seconds)


def shown(snapshot: Snapshot) -> Snapshot:
    """What :func:`render` draws of ``snapshot``, as a value: its clocks in whole
    seconds (every duration is shown in whole seconds or coarser), the moments
    before it as ages, and no moment of taking. Two snapshots with the same
    ``shown`` draw the same picture, so the live panel need not draw the second."""
    taken = snapshot.taken_at
    return attrs.evolve(
        snapshot,
        taken_at=0.0,
        heartbeat_age_s=_whole(snapshot.heartbeat_age_s),
        reconnect_in_s=_whole(snapshot.reconnect_in_s),
        reports_waiting_since=_whole(None if snapshot.reports_waiting_since is None
                                     else taken - snapshot.reports_waiting_since),
        runs=tuple(attrs.evolve(row, elapsed_s=_whole(row.elapsed_s),
                                quiet_s=_whole(row.quiet_s))
                   for row in snapshot.runs),
        finished=tuple(attrs.evolve(row, finished_at=math.floor(taken - row.finished_at))
                       for row in snapshot.finished),
    )


def _executing(snapshot: Snapshot) -> bool:
    """Whether a run's activity may change without a change notice."""
    return any(row.state in ("preparing", "running") for row in snapshot.runs)


# --- the panel task ----------------------------------------------------------------------


def use_panel(console: Console, no_panel: bool) -> bool:
    """Draw the live panel only on a terminal, and not when ``--no-panel`` asks for the log."""
    return console.is_terminal and not no_panel


class Panel:
    """Keeps the terminal's picture of the harness current, or logs what changes.

    ``changes`` (the harness's change notice) lets the live panel draw a change at
    once instead of at its next look; without it, it looks every LIVE_REFRESH_S.
    """

    def __init__(self, console: Console, source: Callable[[], Snapshot], *, live: bool,
                 changes: Changes | None = None) -> None:
        self.console = console
        self.source = source
        self.live = live
        self.changes = changes
        #: The last picture whose changes were logged (:meth:`_say_changes`).
        self._said: Snapshot | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Draw (or log) until cancelled; started once the first frame is up.

        Cancelled: the live display stops with a last, current frame left on the
        screen (and the cursor shown again), and the last changes are logged (in
        both modes: synchronous, nothing to shield). A bug in drawing is logged
        and ends the panel, never the harness.
        """
        self._said = None
        try:
            if self.live:
                await self._run_live(task_status)
            else:
                await self._run_plain(task_status)
        finally:
            # The last change (the run that finished just before the exit, the
            # drain's end) is said too: synchronous, so no cancellation cuts it.
            with contextlib.suppress(Exception):
                self._say_changes(finished(self.source()))

    def _say_changes(self, current: Snapshot) -> None:
        """Log what changed since the last call, one line each (``changelines``):
        on the terminal in the plain mode, and in the log file in both, so that
        ``agent logs`` says the same with the live panel as without it."""
        extra = FILE_ONLY if self.live else None
        for line in describe_change(self._said, current):
            log.info("%s", line, extra=extra)
        self._said = current

    async def _run_live(self, task_status: trio.TaskStatus[None]) -> None:
        # Without a change notice, one that never fires: only the clock wakes it.
        changes = self.changes or Changes()
        # Counted before the first look: a notice made from then on, even while it
        # looks or draws, wakes the first wait at once.
        seen = changes.seen()
        snapshot = self.source()
        self._say_changes(snapshot)
        live = Live(
            render(snapshot, here=True),
            console=self.console,
            # auto_refresh would start rich's refresh thread; this task refreshes instead.
            auto_refresh=False,
            transient=False,
            # print() and stray stderr writes then land above the panel instead of through it.
            redirect_stdout=True,
            redirect_stderr=True,
        )
        live.start(refresh=True)
        try:
            task_status.started()
            await self._keep_drawn(live, snapshot, changes, seen)
        finally:
            # Everything here is synchronous, so a cancellation cannot interrupt it
            # (no shield needed); stop() always runs, restoring the cursor and streams.
            try:
                live.update(render(finished(self.source()), here=True))
            except Exception:
                log.debug("could not draw the last frame", exc_info=True)
            finally:
                live.stop()

    async def _keep_drawn(self, live: Live, snapshot: Snapshot, changes: Changes,
                          seen: int) -> None:
        """Draw what changed, until cancelled or a bug in drawing (logged; returns).

        An idle harness is drawn once a second (its heartbeat age ticks), not
        LIVE_REFRESH_S: every redraw of an unchanged picture is CPU and terminal
        traffic for nothing. A resized terminal is a new picture too (its lines
        are cut to the new width). Cancelled: it just stops.
        """
        drawn = (shown(snapshot), self.console.size)
        looked = trio.current_time()
        while True:
            quiet = self.changes is not None and not _executing(snapshot)
            with trio.move_on_at(looked + (CLOCK_TICK_S if quiet else LIVE_REFRESH_S)):
                await changes.wait_since(seen)
            # A burst of changes (a busy harness) is drawn at most every LIVE_REFRESH_S.
            await trio.sleep_until(looked + LIVE_REFRESH_S)
            # Before the look: a change from now on is seen at the next one.
            seen = changes.seen()
            looked = trio.current_time()
            try:
                snapshot = self.source()
                self._say_changes(snapshot)
                picture = (shown(snapshot), self.console.size)
                if picture != drawn:
                    live.update(render(snapshot, here=True), refresh=True)
                    drawn = picture
            except Exception:
                log.exception("the status panel failed; the harness carries on without it")
                return

    async def _run_plain(self, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        while True:
            try:
                self._say_changes(self.source())
            except Exception:
                log.exception("the status log failed; the harness carries on without it")
                return
            await trio.sleep(PLAIN_POLL_S)
