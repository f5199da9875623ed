"""The plain-log fallback of the status panel: one line per meaningful change.

When there is no terminal (a service manager's journal, ``--no-panel``) the panel
task of :mod:`prohost.engine.view.panel` logs what changed between two
snapshots instead of drawing them; the words are :mod:`prohost.engine.view.statustext`'s.
"""

from __future__ import annotations

from prohost.engine.view.snapshot import FinishedRow, Snapshot
from prohost.engine.view.statustext import (
    account_text,
    brain_line,
    clean,
    compact_duration,
    cost_text,
    server_host,
    tokens_text,
)


def _connection_line(snapshot: Snapshot) -> str:
    host = server_host(snapshot.server)
    if snapshot.connection == "connected":
        return f"connected to {host}"
    if snapshot.connection == "connecting":
        return f"connecting to {host}"
    if snapshot.connection == "reconnecting":
        line = "reconnecting"
        if snapshot.reconnect_in_s is not None:
            line += f" in {compact_duration(snapshot.reconnect_in_s)}"
        if snapshot.last_error:
            line += f" ({clean(snapshot.last_error)})"
        return line
    running = len(snapshot.runs)
    if snapshot.connection == "draining":
        return f"draining: finishing {running} run{'s' if running != 1 else ''}, " \
               "accepting no new ones"
    if snapshot.connection == "stopping":
        return f"stopping {running} run{'s' if running != 1 else ''}"
    return {"drained": "drained: every run finished", "stopped": "stopped"}.get(
        snapshot.connection, "exited")


def _run_name(run_id: str, conversation: str | None) -> str:
    return f"run {run_id}" + (f" ({clean(conversation)})" if conversation else "")


def did_text(row: FinishedRow) -> str:
    """``3 files (+12 −2), 1 commit · 12.3k tokens · $0.04``: what a run did, as far
    as its report said (the panel's words, and the plain log's)."""
    parts = [row.changes] if row.changes else []
    if row.tokens:
        parts.append(f"{tokens_text(row.tokens)} tokens")
    if row.cost_usd is not None:
        parts.append(cost_text(row.cost_usd))
    return " · ".join(parts)


def _took(seconds: float) -> str:
    """``40 ms``, ``9.8 s``, then as :func:`compact_duration`: a run of under a
    second did not take ``0 s``."""
    if seconds < 1:
        return f"{round(seconds * 1000)} ms"
    return f"{seconds:.1f} s" if seconds < 10 else compact_duration(seconds)


def describe_change(previous: Snapshot | None, current: Snapshot) -> list[str]:
    """One short line per meaningful change from ``previous`` to ``current``.

    Only facts that changed count: clocks moving on (elapsed, heartbeat age,
    countdowns) say nothing, so an idle harness logs nothing at all.
    """
    if previous is None:
        return [f"{_connection_line(current)} as machine {current.machine}, "
                f"brain {brain_line(current)}, {current.slots} slot"
                f"{'s' if current.slots != 1 else ''}"]
    lines: list[str] = []
    if previous.connection != current.connection or (
        current.connection == "reconnecting" and previous.last_error != current.last_error
    ):
        lines.append(_connection_line(current))
    if (previous.brain_version, previous.model) != (current.brain_version, current.model):
        lines.append(f"brain: {brain_line(current)}")
    before = {row.run_id: row for row in previous.runs}
    seen_finished = {row.run_id for row in previous.finished}
    newly_finished = [row for row in current.finished if row.run_id not in seen_finished]
    finished_ids = {row.run_id for row in newly_finished}
    for row in current.runs:
        old = before.get(row.run_id)
        name = _run_name(row.run_id, row.conversation)
        if old is None:
            lines.append(f"{name} started: {row.state}")
        elif old.state != row.state and not (
            row.state == "reporting" and row.run_id in finished_ids
        ):
            # Reporting right after finishing is said by the ✓/✗ line below.
            lines.append(f"{name}: {old.state} → {row.state}")
    # The snapshot keeps finished runs newest first; the log reads oldest first.
    for done in reversed(newly_finished):
        name = _run_name(done.run_id, done.conversation)
        took = "" if done.duration_s is None else _took(done.duration_s)
        if done.ok:
            # What it changed and cost, as the panel's row says (issue 28 point 10).
            did = did_text(done)
            lines.append(f"✓ {name} finished" + (f" in {took}" if took else "")
                         + (f": {did}" if did else ""))
        else:
            lines.append(f"✗ {name} failed" + (f" after {took}" if took else "")
                         + f": {clean(done.error or 'no reason given')}")
    current_ids = {row.run_id for row in current.runs}
    known_finished = seen_finished | finished_ids
    for run_id, old in before.items():
        # A run that leaves without a finished row was dropped (cancelled while
        # queued, or forgotten); one that has finished has just been reported.
        if run_id not in current_ids and run_id not in known_finished:
            lines.append(f"{_run_name(run_id, old.conversation)} dropped")
    if previous.queued != current.queued:
        lines.append(f"queued: {current.queued}")
    if previous.reports_waiting != current.reports_waiting:
        lines.append(f"reports waiting for the server: {current.reports_waiting}")
    before_accounts = {row.name: row for row in previous.accounts}
    for account in current.accounts:
        was = before_accounts.get(account.name)
        if was is not None and (was.state, was.resets_at) != (account.state, account.resets_at):
            lines.append(f"account {account_text(account)}")
    return lines
