"""The supervisor's chores beside the runs: the agent CLI's version, account
resets, the daily worktree collection and ledger prune, the status file, and at
start the sweep of MCP folders that runs of an earlier process left behind.

Each chore is handed the few parts it uses (:class:`Chores` gathers them for
:meth:`Chores.start`); they log under ``prohost.harness``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import re
import shutil
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import attrs
import trio

from prohost import __version__
from prohost.engine import lognames
from prohost.engine.accounts.book import AccountBook, folder_variables
from prohost.engine.accounts.gate import AccountGate
from prohost.engine.agent.brains.base import Brain
from prohost.engine.agent.environment import SCRATCH_NAME_CHARS
from prohost.engine.agent.stderrtail import prune_tails
from prohost.engine.blocking import Bounds
from prohost.engine.changes import Changes
from prohost.engine.ledger import LedgerError
from prohost.engine.ledger.interfaces import DailySteps, PruneSteps
from prohost.engine.repos.collect import Holding, collect_garbage
from prohost.engine.repos.gitsession import Confine
from prohost.engine.repos.lanemarker import read_marker
from prohost.engine.repos.worktrees import WORKTREES_DIR, checkout_names, lane_folder_name
from prohost.engine.retention import CLEAR_EVERY_S, DAY_S, IDLE_LANE_S, KEEP_RUNS_S
from prohost.engine.run.heldrun import HeldRun
from prohost.engine.run.leftovers import (
    conversations_with_folders,
    forget_conversation,
    last_written,
    sweep_overlay_work,
)
from prohost.engine.view.status_file import Facts, Observed, keep_status_file, take_snapshot
from prohost.options import Options
from prohost.repospec import is_checkout

log = logging.getLogger(lognames.HARNESS)

#: `claude --version` and the like answer at once; a hung one must not matter (seconds).
BRAIN_PROBE_TIMEOUT_S = 10.0

#: A run's MCP folder's name (prohost.engine.agent.environment.scratch_folder): nothing
#: else in the scratch root is ever removed.
_SCRATCH_NAME = re.compile(f"[0-9a-f]{{{SCRATCH_NAME_CHARS}}}")


async def sweep_scratch(root: Path, bounds: Bounds) -> None:
    """Remove the MCP folders (each with its 0600 token) that runs of an earlier
    process left behind in ``root``: a kill -9 or a third signal skips a run's own
    cleanup.

    Call it at start, before any run of this harness can start (the instance lock
    keeps every other harness off this home), so every such folder is a leftover.
    Bounded (and hurried by the second signal); a failure is logged, and the next
    start tries again. Cancelled: as :meth:`prohost.engine.blocking.Bounds.run`.
    """
    try:
        # Abandoning is safe: only leftovers are in it, and the next start goes on.
        removed = await bounds.file_step(_sweep, root,
                                         what=f"removing old MCP folders in {root}")
    except OSError as exc:
        log.warning("could not remove the MCP folders earlier runs left in %s: %s", root, exc)
        return
    if removed:
        log.info("removed %d MCP folder(s) that runs of an earlier process left in %s",
                 removed, root)


async def sweep_overlays(home: Path, bounds: Bounds) -> None:
    """Remove the overlays' work folders that confinements of an earlier process
    left in ``home`` (:func:`~prohost.engine.run.confine.sweep_overlay_work`). Call
    it at start, before any run of this harness can start, as
    :func:`sweep_scratch`. A failure is logged, and the next start tries again.
    Cancelled: as :meth:`prohost.engine.blocking.Bounds.run`."""
    try:
        removed = await bounds.file_step(sweep_overlay_work, home,
                                         what="removing old overlay work folders")
    except OSError as exc:
        log.warning("could not remove the overlay work folders earlier runs left in %s: %s",
                    home, exc)
        return
    if removed:
        log.info("removed %d overlay work folder(s) that runs of an earlier process left",
                 removed)


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


async def announce_resets(book: AccountBook, gate: AccountGate,
                          clock: Callable[[], float]) -> None:
    """Announce each account whose limit's reset has come (status, panel), and
    wake queued runs waiting for it: the book changes by the clock alone.

    Cancelled: nothing to undo.
    """
    while True:
        reset = book.earliest_reset(clock())
        with trio.move_on_after(math.inf if reset is None
                                else max(0.0, reset - clock()) + 0.01):
            await gate.book_changed.wait()
            continue
        # The reset passed: the book expires it on the next question, and the
        # next time every account is limited, --limit-wait counts afresh.
        gate.limit_wait_deadline()
        gate.book_moved()


#: Under ``$PROHOST_HOME``: the CLI folders the version probe's CLI is given.
PROBE_FOLDERS = Path("cli") / "version-probe"


def _probe_env(brain: Brain, env: Mapping[str, str], home: Path) -> dict[str, str]:
    """``env`` with each of the CLI's own folder variables that it does not set
    pointed at a folder of the harness's (made): asked its version, Codex makes its
    folder (``~/.codex/tmp``) and the person's home is never where prohost makes
    anything. Blocking."""
    probed = dict(env)
    for variable in folder_variables(brain.name):
        if not probed.get(variable, "").strip():
            folder = home / PROBE_FOLDERS / variable.lower()
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            probed[variable] = str(folder)
    return probed


async def probe_brain(brain: Brain, env: Mapping[str, str], facts: Facts, *,
                      home: Path) -> None:
    """Ask the agent CLI its version once, for the status message (§5.7), with
    its folders in ``home`` (``$PROHOST_HOME``) where ``env`` names none.

    Cancelled: ``trio.run_process`` kills the CLI; the version stays unknown.
    """
    command = brain.version_command()
    if command is None:
        return
    with trio.move_on_after(BRAIN_PROBE_TIMEOUT_S):
        try:
            # A mkdir -p: abandoning it (the thread goes on) leaves nothing half done.
            env = await trio.to_thread.run_sync(_probe_env, brain, env, home,
                                                abandon_on_cancel=True)
            result = await trio.run_process(
                command, shell=True, capture_stdout=True, capture_stderr=True,
                check=False, env=env, stdin=b"",
            )
        except OSError as exc:
            log.warning("could not ask %s its version: %s", brain.name, exc)
            return
        lines = result.stdout.decode("utf-8", "replace").strip().splitlines()
        if result.returncode == 0 and lines:
            facts.learned_version(lines[0].strip()[:80])
            log.info("agent CLI: %s %s", brain.name, facts.brain_version)
        else:
            log.warning("`%s` failed (exit %s): is the agent CLI installed?", command,
                        result.returncode)


@attrs.frozen(eq=False)
class DailyPass:
    """What :mod:`prohost.engine.retention` clears once a day in ``home``: the
    ledger's old runs (through ``steps``), the stderr tails, and the worktrees of
    idle conversations, or their agent folders where they have none — never one
    with a run in flight (one of ``runs``), and a lane held (``hold``, the
    scheduler's) while its worktrees or folders go; their git runs
    confined by ``confine`` (``None``: unconfined). Every file step goes through
    ``bounds``, the harness's, which its second signal hurries. Made once by
    :meth:`Chores.start`."""

    home: Path
    bounds: Bounds
    steps: DailySteps | None = None
    runs: Mapping[str, HeldRun] = attrs.Factory(dict)
    hold: Holding | None = None
    confine: Confine | None = None
    clock: Callable[[], float] = time.time

    def every_day(self, *, worktrees: bool) -> list[Callable[[], Awaitable[None]]]:
        """The daily chores, as :meth:`Chores.start` starts them: the ledger and the
        stderr tails pruned, the idle conversations' worktrees collected (with
        ``--repos``: ``worktrees``) and, for every harness, the idle conversations'
        agent folders (a harness without ``--repos`` has no worktrees to take
        them with)."""
        chores: list[Callable[[], Awaitable[None]]] = [self.prune_daily]
        if worktrees:
            chores.append(self.collect_worktrees_daily)
        chores.append(self.collect_conversations_daily)
        return chores

    async def prune_daily(self) -> None:
        """Once a day (:data:`~prohost.engine.retention.CLEAR_EVERY_S`), :meth:`clear_old`.

        Cancelled: between passes, nothing to undo; a pass in progress finishes each
        step within its bound.
        """
        while True:
            await trio.sleep(CLEAR_EVERY_S)
            await self.clear_old()

    async def clear_old(self) -> None:
        """One pass of what :mod:`prohost.engine.retention` keeps for a time: the
        ledger's old reported runs (:func:`prune`) and the stderr tails
        (:meth:`prune_stderr_tails`). Never raises for a failing disk: logged, tried
        again next time. Cancelled: as the step under way."""
        if self.steps is not None:
            await prune(self.steps)
        await self.prune_stderr_tails()

    async def prune_stderr_tails(self) -> int:
        """Remove the stderr tails past their period; how many. A failing or hung disk
        is logged, not raised: pruning can wait a day. Cancelled: as
        :meth:`prohost.engine.blocking.Bounds.file_step` (abandoning a listing and
        unlinks of files only the harness reads is safe)."""
        try:
            return await self.bounds.file_step(prune_tails, self.home,
                                               what="pruning the stderr tails")
        except OSError as exc:
            log.warning("could not prune the stderr tails: %s", exc)
            return 0

    async def collect_worktrees_daily(self) -> None:
        """Once a day, :meth:`collect_worktrees`. Cancelled: an in-progress removal
        is finished (shielded inside ``collect_garbage``)."""
        while True:
            await trio.sleep(CLEAR_EVERY_S)
            await self.collect_worktrees()

    async def collect_worktrees(self, *, now: float | None = None) -> None:
        """Remove the worktrees of lanes idle for 14 days (clean ones only; see
        :func:`~prohost.engine.repos.collect.collect_garbage`). Errors, and a disk
        that hangs past a step's bound, are logged. Cancelled: as
        :meth:`collect_worktrees_daily`.
        """
        runs, home = self.runs, self.home
        try:
            entries = await collect_garbage(
                home, older_than_s=IDLE_LANE_S, dry_run=False, force=False,
                # Live, not a snapshot: GC asks again just before it removes anything.
                busy=lambda lane: any(h.lane == lane for h in runs.values()),
                hold=self.hold,
                now=now,
                bounds=self.bounds,
                with_folder=functools.partial(forget_conversation, home),
                confine=self.confine,
            )
        except OSError as exc:
            log.warning("could not collect old worktrees: %s", exc)
            return
        for entry in entries:
            (log.info if entry.action == "removed" else log.debug)(
                "worktrees of %s: %s (%s)", entry.lane, entry.action, entry.detail)


    async def collect_conversations_daily(self) -> None:
        """Once a day, :meth:`collect_conversation_folders`. Cancelled: between
        passes, nothing to undo; a removal under way is finished (shielded and
        bounded)."""
        while True:
            await trio.sleep(CLEAR_EVERY_S)
            await self.collect_conversation_folders(now=self.clock())

    async def collect_conversation_folders(self, *, now: float) -> list[str]:
        """Remove the agent folders of the harness's (CLI folders of every account, ACP
        agents' folders: :func:`~prohost.engine.run.leftovers.conversation_folders`)
        of each conversation that has had no run for :data:`IDLE_LANE_S` by the
        ledger (where it no longer knows the conversation: by when its folders were
        last written); the lane folder names of those removed. A conversation that
        has worktrees is left to their collection, which takes its folders with them
        (:meth:`collect_worktrees`). Never while a run of the conversation is held
        (``runs``): the lane is held (``hold``) for the removal, and looked at again
        inside. Errors and a hung disk are logged; the next pass tries again.
        Cancelled: a removal under way is finished (shielded, bounded); the rest wait
        for the next pass."""
        steps, bounds, home, runs = self.steps, self.bounds, self.home, self.runs
        if steps is None:
            return []
        try:
            last = await steps.lanes_last_used()
            found = await bounds.file_step(_without_worktrees, home,
                                           what="listing the conversations' agent folders")
        except (LedgerError, OSError) as exc:
            log.warning("could not collect idle conversations' agent folders: %s", exc)
            return []
        lanes = {lane_folder_name(lane): lane for lane in last}
        held = {lane_folder_name(run.lane) for run in runs.values()}
        removed = []
        for name, folders in found.items():
            if name in held:
                continue
            lane = lanes.get(name)
            try:
                used = last[lane] if lane is not None else await bounds.file_step(
                    last_written, folders, what=f"reading the agent folders of {name}")
                if now - used <= IDLE_LANE_S:
                    continue
                holding = (self.hold(lane) if lane is not None and self.hold is not None
                           else contextlib.nullcontext())
                async with holding:
                    # Looked at again with the lane held: a turn may have come meanwhile.
                    if any(lane_folder_name(run.lane) == name for run in runs.values()) or (
                            lane is not None
                            and (await steps.lanes_last_used()).get(lane, used) != used):
                        continue
                    # Shielded and bounded by the step itself.
                    await bounds.file_step(forget_conversation, home, name,
                                           what=f"removing the agent folders of {name}")
            except (LedgerError, OSError) as exc:
                log.warning("could not remove the agent folders of conversation %s: %s",
                            name, exc)
                continue
            log.info("removed the agent folders of conversation %s: no run for %d days",
                     name, int((now - used) // DAY_S))
            removed.append(name)
        return removed


def _without_worktrees(home: Path) -> dict[str, list[Path]]:
    """Blocking: the conversations with agent folders and no worktrees folder. The
    agent folders are keyed by the lane's :func:`lane_folder_name`; a worktrees
    folder has a name a person reads (or an earlier version's), so it is matched
    by the lane its marker records."""
    with_worktrees: set[str] = set()
    worktrees = home / WORKTREES_DIR
    if worktrees.is_dir():
        for folder in worktrees.iterdir():
            lane = read_marker(folder).lane if folder.is_dir() else None
            with_worktrees.add(lane_folder_name(lane) if lane is not None else folder.name)
    return {name: folders for name, folders in conversations_with_folders(home).items()
            if name not in with_worktrees}



async def prune(steps: PruneSteps) -> int:
    """Empty and forget old reported runs (see Ledger.prune); how many rows changed.

    A failing or hung disk is logged, not raised: pruning can wait a day.
    Cancelled: as :meth:`prohost.engine.blocking.Bounds.run`.
    """
    try:
        # Abandoning is safe: one transaction under the ledger's lock.
        return await steps.prune(KEEP_RUNS_S)
    except (LedgerError, OSError) as exc:
        log.warning("could not prune the ledger: %s", exc)
        return 0


@attrs.frozen(eq=False)
class Chores:
    """What the chores are handed (by the composition root); ``None`` parts (no
    ledger: a dry run) turn their chores off."""

    #: What the status file shows, and the options, brain, facts, book, runs and
    #: outbox the other chores read from it.
    seen: Observed
    env: Mapping[str, str]
    hold: Holding
    bounds: Bounds
    changes: Changes
    steps: DailySteps | None = None
    gate: AccountGate | None = None
    worktrees: bool = False
    #: How the collection's git runs confined (``None``: unconfined).
    git_confine: Confine | None = None

    def start(self, nursery: trio.Nursery) -> None:
        """Start the periodic chores in ``nursery``, and say what the harness does.

        The chores live as long as the nursery; each one's own docstring says what
        cancelling it leaves behind.
        """
        seen = self.seen
        if self.steps is not None:
            daily = DailyPass(seen.options.home, self.bounds, self.steps, seen.runs,
                              self.hold, self.git_confine, seen.clock)
            for chore in daily.every_day(worktrees=self.worktrees):
                nursery.start_soon(chore)
        nursery.start_soon(functools.partial(probe_brain, seen.brain, self.env, seen.facts,
                                             home=seen.options.home))
        if self.gate is not None:
            nursery.start_soon(announce_resets, seen.book, self.gate, seen.clock)
        if not seen.options.dry_run:
            nursery.start_soon(functools.partial(
                keep_status_file, functools.partial(take_snapshot, seen),
                changes=self.changes, home=seen.options.home,
                bounds=self.bounds))
        announce_start(seen.options, seen.brain)


def announce_start(options: Options, brain: Brain) -> None:
    """Log, once at start, what this harness does and what looks wrong."""
    mode = " (dry run: nothing is executed or reported)" if options.dry_run else ""
    log.info(
        "prohost %s on %s: up to %d run(s) at once with %r%s%s",
        __version__,
        options.machine,
        options.concurrency,
        options.exec_command,
        where_runs_work(options),
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
    if brain.name == "claude" and not options.safe_tools and _is_root():
        log.warning(
            "running as root: Claude Code refuses --dangerously-skip-permissions for "
            "root, so every run will fail; run the harness as a normal user, or pass "
            "--safe-tools to keep the CLI's permission prompts"
        )
    if options.allow_unverified:
        log.warning(
            "--allow-unverified: deliveries with a missing or wrong signature are accepted"
        )


def where_runs_work(options: Options) -> str:
    """Where each run's agent starts, as the start line says it (§5.3,
    :func:`prohost.engine.run.staging.workdir_for`): with ``--repos``, its
    conversation's worktree of the first checkout, never ``--workdir``."""
    if not options.repos:
        return f" in {options.workdir}"
    first = checkout_names(options.repos)[0]
    return (f", each run in its conversation's own worktree of {options.repos[0]} "
            f"({options.home / WORKTREES_DIR}/<conversation>/{first})")


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0
