"""The supervisor's chores beside the runs: the agent CLI's version, account
resets, the daily worktree collection and ledger prune, and at start the sweep of
MCP folders that runs of an earlier process left behind.

Each is a task in :class:`prohost.engine.harness.Harness`'s nursery (or, for the prune,
a step of the restart recovery); they log under ``prohost.harness``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from prohost import __version__
from prohost.engine.accounts.gate import AccountGate
from prohost.engine.agent.environment import SCRATCH_NAME_CHARS
from prohost.engine.ledger import LedgerError
from prohost.engine.repos.collect import collect_garbage
from prohost.engine.view.status_file import keep_status_file
from prohost.options import is_checkout

if TYPE_CHECKING:
    from prohost.engine.harness import Harness

log = logging.getLogger("prohost.harness")

#: Reported rows older than this (seconds) are pruned (§7), checked this often (seconds).
PRUNE_AGE_S = 7 * 86400.0
PRUNE_EVERY_S = 86400.0
#: Worktrees of lanes idle this long (seconds) are collected by the daily pass.
WORKTREE_IDLE_S = 14 * 86400.0
#: `claude --version` and the like answer at once; a hung one must not matter (seconds).
BRAIN_PROBE_TIMEOUT_S = 10.0

#: A run's MCP folder's name (prohost.engine.agent.environment.scratch_folder): nothing else
#: in the scratch root is ever removed.
_SCRATCH_NAME = re.compile(f"[0-9a-f]{{{SCRATCH_NAME_CHARS}}}")


async def sweep_scratch(harness: Harness) -> None:
    """Remove the MCP folders (each with its 0600 token) that runs of an earlier
    process left behind: a kill -9 or a third signal skips a run's own cleanup.

    Call it at start, before any run of this harness can start (the instance lock
    keeps every other harness off this home), so every such folder is a leftover.
    Bounded (and hurried by the second signal); a failure is logged, and the next
    start tries again. Cancelled: as :meth:`prohost.engine.blocking.Bounds.run`.
    """
    if harness.runner is None:
        return  # a dry run writes no MCP folder
    root = harness.runner.scratch_root
    try:
        # Abandoning is safe: only leftovers are in it, and the next start goes on.
        removed = await harness.bounds.file_step(_sweep, root,
                                                 what=f"removing old MCP folders in {root}")
    except OSError as exc:
        log.warning("could not remove the MCP folders earlier runs left in %s: %s", root, exc)
        return
    if removed:
        log.info("removed %d MCP folder(s) that runs of an earlier process left in %s",
                 removed, root)


def _sweep(root: Path) -> int:
    """Blocking: remove every run folder in ``root``; how many there were."""
    try:
        entries = [entry for entry in os.scandir(root)
                   if _SCRATCH_NAME.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return 0
    for entry in entries:
        # Gone meanwhile: its run's own removal, abandoned on a hung disk, ended.
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(entry.path)
    return len(entries)


async def announce_resets(harness: Harness, gate: AccountGate) -> None:
    """Announce each account whose limit's reset has come (status, panel), and
    wake queued runs waiting for it: the book changes by the clock alone.

    Cancelled: nothing to undo.
    """
    while True:
        reset = harness.book.earliest_reset(harness.clock())
        with trio.move_on_after(math.inf if reset is None
                                else max(0.0, reset - harness.clock()) + 0.01):
            await gate.book_changed.wait()
            continue
        # The reset passed: the book expires it on the next question, and the
        # next time every account is limited, --limit-wait counts afresh.
        gate.limit_wait_deadline()
        gate.book_moved()


async def probe_brain(harness: Harness) -> None:
    """Ask the agent CLI its version once, for the status message (§5.7).

    Cancelled: ``trio.run_process`` kills the CLI; the version stays unknown.
    """
    command = harness.brain.version_command()
    if command is None:
        return
    with trio.move_on_after(BRAIN_PROBE_TIMEOUT_S):
        try:
            result = await trio.run_process(
                command, shell=True, capture_stdout=True, capture_stderr=True,
                check=False, env=harness.env, stdin=b"",
            )
        except OSError as exc:
            log.warning("could not ask %s its version: %s", harness.brain.name, exc)
            return
        lines = result.stdout.decode("utf-8", "replace").strip().splitlines()
        if result.returncode == 0 and lines:
            harness.brain_version = lines[0].strip()[:80]
            log.info("agent CLI: %s %s", harness.brain.name, harness.brain_version)
            harness.changed()
        else:
            log.warning("`%s` failed (exit %s): is the agent CLI installed?", command,
                        result.returncode)


async def collect_worktrees_daily(harness: Harness) -> None:
    """Once a day, :func:`collect_worktrees`. Cancelled: an in-progress removal
    is finished (shielded inside ``collect_garbage``)."""
    while True:
        await trio.sleep(PRUNE_EVERY_S)
        await collect_worktrees(harness)


async def collect_worktrees(harness: Harness, *, now: float | None = None) -> None:
    """Remove worktrees of lanes idle for 14 days (clean ones only), never a lane
    with a run in flight: a lane is held in the scheduler while its worktrees
    are removed, so a turn arriving meanwhile starts after, and prepares them
    afresh. Errors are logged. Cancelled: as :func:`collect_worktrees_daily`.
    """
    try:
        entries = await collect_garbage(
            harness.options.home, older_than_s=WORKTREE_IDLE_S, dry_run=False, force=False,
            # Live, not a snapshot: GC asks again just before it removes anything.
            busy=lambda lane: any(h.lane == lane for h in harness.held.values()),
            hold=harness.scheduler.holding,
            now=now,
        )
    except OSError as exc:
        log.warning("could not collect old worktrees: %s", exc)
        return
    for entry in entries:
        (log.info if entry.action == "removed" else log.debug)(
            "worktrees of %s: %s (%s)", entry.lane, entry.action, entry.detail)


async def prune_daily(harness: Harness) -> None:
    """Once a day, prune the ledger (§7; see :func:`prune`).

    Cancelled: between prunes, nothing to undo; a prune in progress finishes,
    within its bound.
    """
    while True:
        await trio.sleep(PRUNE_EVERY_S)
        await prune(harness)


async def prune(harness: Harness) -> int:
    """Empty and forget old reported runs (see Ledger.prune); how many rows changed.

    A failing or hung disk is logged, not raised: pruning can wait a day.
    Cancelled: as :meth:`prohost.engine.blocking.Bounds.run`.
    """
    if harness.ledger is None:
        return 0
    try:
        # Abandoning is safe: one transaction under the ledger's lock.
        return await harness.bounded(harness.ledger.prune, time.time(), PRUNE_AGE_S,
                                   what="pruning the ledger")
    except (LedgerError, OSError) as exc:
        log.warning("could not prune the ledger: %s", exc)
        return 0


def start_chores(harness: Harness, nursery: trio.Nursery) -> None:
    """Start the harness's periodic chores in its nursery, and say what it does.

    The chores live as long as the nursery; each one's own docstring says what
    cancelling it leaves behind.
    """
    if harness.ledger is not None:
        nursery.start_soon(prune_daily, harness)
        if harness.worktrees.enabled:
            nursery.start_soon(collect_worktrees_daily, harness)
    nursery.start_soon(probe_brain, harness)
    if harness.runner is not None:
        nursery.start_soon(announce_resets, harness, harness.runner.accounts)
        # Reports that outlived their window, tried again until they settle (§7).
        nursery.start_soon(harness.runner.outbox.run)
    if not harness.options.dry_run:
        nursery.start_soon(keep_status_file, harness)
    announce_start(harness)


def announce_start(harness: Harness) -> None:
    """Log, once at start, what this harness does and what looks wrong."""
    options = harness.options
    mode = " (dry run: nothing is executed or reported)" if options.dry_run else ""
    log.info(
        "prohost %s on %s: up to %d run(s) at once with %r in %s%s",
        __version__,
        options.machine,
        options.concurrency,
        options.exec_command,
        options.workdir,
        mode,
    )
    if options.repos:
        log.info("each conversation gets its own worktree of: %s",
                 ", ".join(map(str, options.repos)))
        for repo in options.repos:
            if not is_checkout(repo):
                log.warning("--repos: %s is not a git checkout right now; runs will be "
                            "told it is read-only until it is", repo)
    elif options.concurrency > 1:
        log.info("no --repos: runs in parallel share every checkout on this machine; "
                 "name the repositories the agent edits with --repos to give each "
                 "conversation its own")
    if harness.brain.name == "claude" and not options.safe_tools and _is_root():
        log.warning(
            "running as root: Claude Code refuses --dangerously-skip-permissions for "
            "root, so every run will fail; run the harness as a normal user, or pass "
            "--safe-tools to keep the CLI's permission prompts"
        )
    if options.allow_unverified:
        log.warning(
            "--allow-unverified: deliveries with a missing or wrong signature are accepted"
        )


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0
