"""``prohost agent gc``: clear away the private worktrees of conversations gone quiet.

Each conversation's worktrees (see :mod:`prohost.engine.repos.worktrees`) persist between its
turns, so they pile up. This removes those of conversations idle for longer than
``--older-than`` days, keeps any that hold work existing nowhere else (uncommitted
changes, commits on no branch) unless ``--force``, and says what it did with each.

It may run while a harness is using the same home: a conversation used while the
collection looks at it is skipped. The harness also runs the same collection once a
day, where it also skips conversations with a run queued or running.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

from prohost.engine.repos.collect import GcEntry, collect_garbage
from prohost.engine.repos.worktrees import WORKTREES_DIR

DEFAULT_OLDER_THAN_DAYS = 14.0
OLDER_THAN_RANGE = "a number of days of 0 or more, e.g. 14 or 0.5"

_DAY_S = 86400.0
_DAYS = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")


def parse_older_than(raw: str) -> float:
    """``--older-than``: days as a plain decimal number; :class:`ValueError` (one line) if not."""
    # Plain decimal digits only: float() would also take "nan", "inf", "1e3" and "-1".
    match = _DAYS.fullmatch(raw.strip())
    days = float(match[0]) if match else math.nan
    if not math.isfinite(days) or days * _DAY_S > 1e15:
        raise ValueError(f"--older-than must be {OLDER_THAN_RANGE} (got {raw!r})")
    return days


def _idle(seconds: float) -> str:
    days = seconds / _DAY_S
    if days >= 1:
        return f"{days:.1f} days"
    hours = seconds / 3600
    return f"{hours:.1f} hours" if hours >= 1 else f"{seconds / 60:.0f} minutes"


def format_entries(entries: list[GcEntry], *, older_than_days: float, dry_run: bool) -> list[str]:
    """The report: one line per lane folder, then a count."""
    width = max(len(entry.action) for entry in entries)
    lines = []
    for entry in entries:
        who = entry.lane if entry.lane is not None else "unknown conversation"
        lines.append(
            f"  {entry.action:<{width}}  {entry.lane_folder.name}  ({who}, idle "
            f"{_idle(entry.idle_s)}): {entry.detail}"
        )
    gone = sum(entry.action in ("removed", "would-remove") for entry in entries)
    kept = len(entries) - gone
    verb = "would remove" if dry_run else "removed"
    lines.append(
        f"{verb} the worktrees of {gone} conversation(s), kept {kept} "
        f"(idle limit {older_than_days:g} days)"
    )
    return lines


async def gc_command(home: Path, older_than_days: float, dry_run: bool, force: bool) -> int:
    """Run one collection under ``home`` and print what happened; 0, or 1 on an error.

    Cancelled (Ctrl-C): the worktree being removed is finished first (shielded and
    bounded, see :func:`~prohost.engine.repos.collect.collect_garbage`), then the cancel goes on.
    """
    root = home / WORKTREES_DIR
    try:
        entries = await collect_garbage(
            home, older_than_s=older_than_days * _DAY_S, dry_run=dry_run, force=force
        )
    except OSError as exc:
        where = exc.filename or root
        print(
            f"prohost agent gc: error: cannot read {where}: {exc.strerror or exc}", file=sys.stderr
        )
        return 1
    if not entries:
        print(f"no conversation worktrees in {root}")
        return 0
    mode = " (dry run: nothing is removed)" if dry_run else ""
    print(f"conversation worktrees in {root}{mode}:")
    for line in format_entries(entries, older_than_days=older_than_days, dry_run=dry_run):
        print(line)
    return 0

