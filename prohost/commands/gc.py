"""``prohost agent gc``: clear away the private worktrees of conversations gone quiet.

Each conversation's worktrees (see :mod:`prohost.engine.repos.worktrees`) persist between its
turns, so they pile up. This removes those of conversations idle for longer than
``--older-than`` days, keeps any that hold work existing nowhere else (uncommitted
changes, commits on no branch) unless ``--force``, and says what it did with each.

It may run while a harness is using the same home. The home's lock says whether one
is: when it is free, this command holds it while it collects, so no harness can start
using a worktree meanwhile; when a harness holds it, the conversations it is running
are read from its status file (``status.json``, rewritten every few seconds) before
each look and again just before each removal, and kept. A status file that is
missing, left by another process, or not current means the busy ones cannot be told
apart, so the command refuses and says what to do. The harness also runs the same
collection once a day, where it also skips conversations with a run queued or running.
"""

from __future__ import annotations

import functools
import math
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import trio

from prohost.commands.status import pid_alive
from prohost.engine.repos.collect import GcEntry, collect_garbage
from prohost.engine.repos.gitsession import Confine
from prohost.engine.repos.lanemarker import read_marker
from prohost.engine.repos.lanenames import LaneNames
from prohost.engine.repos.worktrees import WORKTREES_DIR
from prohost.engine.retention import DAY_S, IDLE_LANE_S
from prohost.engine.run.checkouts import git_confinement
from prohost.engine.run.confine import Sandbox
from prohost.engine.run.leftovers import forget_conversation, sweep_overlay_work
from prohost.engine.sandbox import probe
from prohost.engine.view.snapshot import (
    REFRESH_S,
    STALE_AFTER_S,
    STATUS_FILE,
    Snapshot,
    read_snapshot,
)
from prohost.engine.view.statustext import human_ago
from prohost.home import GC, HARNESS, LOCK_FILE, InstanceLock, LockHeld, gc_holds_it
from prohost.invocation import command

DEFAULT_OLDER_THAN_DAYS = IDLE_LANE_S / DAY_S
OLDER_THAN_RANGE = "a number of days of 0 or more, e.g. 14 or 0.5"

_DAYS = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")


def parse_older_than(raw: str) -> float:
    """``--older-than``: days as a plain decimal number; :class:`ValueError` (one line) if not."""
    # Plain decimal digits only: float() would also take "nan", "inf", "1e3" and "-1".
    match = _DAYS.fullmatch(raw.strip())
    days = float(match[0]) if match else math.nan
    if not math.isfinite(days) or days * DAY_S > 1e15:
        raise ValueError(f"--older-than must be {OLDER_THAN_RANGE} (got {raw!r})")
    return days


def _idle(seconds: float) -> str:
    days = seconds / DAY_S
    if days >= 1:
        return f"{days:.1f} days"
    hours = seconds / 3600
    if hours >= 1:
        return f"{hours:.1f} hours"
    minutes = round(seconds / 60)
    return f"{minutes} minute" if minutes == 1 else f"{minutes} minutes"


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


class HarnessUnknown(Exception):
    """A harness holds the home's lock but what it is running cannot be read; the
    message is the one line to print."""


@attrs.frozen
class RunningHarness:
    """The harness holding ``home``'s lock, seen through its status file.

    :meth:`busy` reads the file again at every call, so the collection's last look
    before a removal is as current as the harness's last write.
    """

    home: Path
    #: The pid recorded in the lock file (``None``: not recorded).
    lock_pid: int | None
    clock: Callable[[], float] = time.time
    #: What the lock file says holds it: a harness, or ``None`` (not recorded: a
    #: harness, or a gc of a version that did not say).
    kind: str | None = HARNESS

    def current(self) -> Snapshot:
        """Its status now (its ``runs`` list each run preparing, running, waiting for
        an account or reporting); :class:`HarnessUnknown` when the file cannot vouch
        for the harness holding the lock now."""
        path = self.home / STATUS_FILE
        try:
            snapshot = read_snapshot(self.home)
        except (ValueError, OSError) as exc:
            raise self._unknown(f"its status file cannot be read ({exc})") from None
        if snapshot is None:
            raise self._unknown(f"it has written no status file ({path})")
        if not pid_alive(snapshot.pid):
            raise self._unknown(f"{path} was left by pid {snapshot.pid}, which has exited")
        if self.lock_pid is not None and snapshot.pid != self.lock_pid:
            raise self._unknown(f"{path} was written by pid {snapshot.pid}, not by the "
                                "lock's holder")
        # A clock step can make a fresh file look written in the future: call that fresh.
        age = max(0.0, self.clock() - snapshot.taken_at)
        if age > STALE_AFTER_S:
            raise self._unknown(f"{path} was last written {human_ago(age)} ago (is it hung?)")
        return snapshot

    def busy(self, lane: str) -> bool:
        """Whether ``lane`` may be in use: listed in the status, used since it was
        taken (the status may not show that run yet), or not known either way."""
        # Read in the event loop: one small local file, and nothing else runs in it.
        try:
            snapshot = self.current()
        except HarnessUnknown:
            return True  # the harness stopped writing mid-collection: touch nothing more
        if any(row.lane == lane for row in snapshot.runs):
            return True
        # A turn touches its lane's marker as it prepares, after it is listed as
        # preparing: a use at or after the status was taken may be a run it does not
        # show yet. The margin covers a small clock step between the two.
        root = self.home / WORKTREES_DIR
        name = LaneNames(root, lambda folder: read_marker(folder).lane).lookup(lane)
        used = None if name is None else read_marker(root / name).last_used
        return used is None or used >= snapshot.taken_at - REFRESH_S

    def _unknown(self, reason: str) -> HarnessUnknown:
        who = f"pid {self.lock_pid}" if self.lock_pid else "a process whose pid is not recorded"
        if not self.lock_pid:
            stop = f"`lsof {self.home / LOCK_FILE}` shows which process it is"
        else:
            # `agent stop` drains it (its runs finish first); a gc is waited for.
            stop = f"`{command('agent', 'stop')}`"
            if self.kind != HARNESS:
                stop += "; if it is another `agent gc`, wait for it to finish instead"
        what = "a running agent" if self.kind == HARNESS else "a running agent, or another gc"
        return HarnessUnknown(
            f"{who} holds {self.home / LOCK_FILE} ({what}) but {reason}, so gc cannot "
            f"tell which worktrees are in use and removes none; run it again once "
            f"`{command('agent', 'status')}` shows that agent running, or stop it first "
            f"({stop})"
        )


def _lock_or_holder(home: Path) -> tuple[InstanceLock | None, LockHeld | None] | None:
    """Take ``home``'s lock for the collection, or say who holds it; ``None`` when
    there are no worktrees at all (and then no home or lock file is made)."""
    if not os.path.lexists(home / WORKTREES_DIR):
        return None
    try:
        return InstanceLock.acquire(home, kind=GC), None
    except LockHeld as held:
        return None, held


def _error(message: str) -> None:
    print(f"prohost agent gc: error: {message}", file=sys.stderr)


async def _git_confinement(home: Path) -> Confine | None:
    """How gc's git looks at what runs left (§13): inside a confinement like a
    run's (``$PROHOST_HOME`` and the secret stores hidden, no network) where
    bubblewrap can make one; else ``None`` (unconfined, with the overrides)."""
    support = await trio.to_thread.run_sync(probe)
    user_home = os.environ.get("HOME")
    sandbox = Sandbox(mode="auto", support=support, home=home,
                      user_home=Path(user_home) if user_home else Path.home())
    return git_confinement(sandbox)


async def gc_command(home: Path, older_than_days: float, dry_run: bool, force: bool) -> int:
    """Run one collection under ``home`` and print what happened; 0, or 1 on an error
    (including a harness on ``home`` whose busy conversations cannot be told: see the
    module).

    Cancelled (Ctrl-C): the worktree being removed is finished first (shielded and
    bounded, see :func:`~prohost.engine.repos.collect.collect_garbage`), then the
    cancel goes on; the home's lock, if this took it, is released.
    """
    root = home / WORKTREES_DIR
    try:
        # Returned even when cancelled meanwhile (the thread is waited for), so a lock
        # taken is always released below.
        taken = await trio.to_thread.run_sync(_lock_or_holder, home)
    except OSError as exc:
        _error(f"cannot lock {home / LOCK_FILE}: {exc.strerror or exc}")
        return 1
    if taken is None:
        print(f"no conversation worktrees in {root}")
        return 0
    lock, held = taken
    if held is not None and held.kind == GC:
        # Another collection: it has the home to itself until it is done.
        _error(gc_holds_it(held, home, f"run `{command('agent', 'gc')}` again once it "
                                       "is done"))
        return 1
    harness = None if held is None else RunningHarness(home, held.pid, kind=held.kind)
    try:
        if harness is not None:
            try:
                running = harness.current()
            except HarnessUnknown as exc:
                _error(str(exc))
                return 1
            print(f"a prohost agent (pid {running.pid}) is running on this home: the "
                  "worktrees of the conversations it is running are kept")
        entries = await collect_garbage(
            home, older_than_s=older_than_days * DAY_S, dry_run=dry_run, force=force,
            busy=harness.busy if harness is not None else lambda lane: False,
            with_folder=functools.partial(forget_conversation, home),
            confine=await _git_confinement(home),
        )
        if harness is None:
            # This holds the home's lock: no run is confined, so every overlay work
            # folder left is a crashed harness's.
            await trio.to_thread.run_sync(sweep_overlay_work, home)
    except OSError as exc:
        where = exc.filename or root
        _error(f"cannot read {where}: {exc.strerror or exc}")
        return 1
    finally:
        if lock is not None:
            lock.release()
    if not entries:
        print(f"no conversation worktrees in {root}")
        return 0
    mode = " (dry run: nothing is removed)" if dry_run else ""
    print(f"conversation worktrees in {root}{mode}:")
    for line in format_entries(entries, older_than_days=older_than_days, dry_run=dry_run):
        print(line)
    return 0
