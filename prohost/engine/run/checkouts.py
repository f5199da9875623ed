"""A run's private checkouts (``--repos``, docs/protocol.md §5.1 and §7 ``changes``):
prepared within the run's deadline, their state taken before the agent runs, and
what the run changed in each of them once it has ended."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

import attrs
import trio

from prohost.engine.blocking import Bounds
from prohost.engine.repos.changes import CheckoutReader, CheckoutState, without_paths
from prohost.engine.repos.gitsession import PLAIN_GIT, ConfinedGit
from prohost.engine.repos.lanerepo import Confine
from prohost.engine.repos.worktrees import PreparedCheckouts, WorktreeManager
from prohost.engine.run.confine import Sandbox, hidden_places
from prohost.engine.run.startstate import read_start_state, start_state
from prohost.engine.sandbox import Policy, confined_command, seccomp
from prohost.wire.changes import ChangeEntry, CheckoutChanges, UnreadableCheckout
from prohost.wire.runs import AgentRun

log = logging.getLogger("prohost.execute")


class LaneCheckouts:
    """One run's view of its lane's worktrees (none without ``--repos``)."""

    def __init__(self, worktrees: WorktreeManager | None, bounds: Bounds,
                 env: Mapping[str, str] | None, sandbox: Sandbox | None = None,
                 scratch_root: Path | None = None) -> None:
        """``worktrees``: the harness's, ``None`` (or disabled) without ``--repos``;
        ``sandbox``: how runs are confined, which the harness's own git on what a
        run wrote is too (bringing its branch back), its scratch under
        ``scratch_root``."""
        self.confine = git_confinement(sandbox) if sandbox is not None else None
        self.scratch_root = scratch_root
        self.worktrees = worktrees if worktrees is not None and worktrees.enabled else None
        self.bounds = bounds
        self.env = env
        #: What :meth:`prepare` made (``None`` without --repos).
        self.prepared: PreparedCheckouts | None = None
        self._before: list[CheckoutState] = []
        self._unready: list[tuple[str, str]] = []
        #: The lane of a run without a conversation (prepared in this process):
        #: its worktrees go at its end unless it changed something there.
        self._lone: str | None = None
        #: The changes once its worktrees are gone (read again, they are the same).
        self._discarded: list[ChangeEntry] | None = None

    async def prepare(self, run: AgentRun, deadline: float) -> bool:
        """Make the lane's worktrees and take their state; False when the run's
        ``deadline`` (trio time) came first (nothing is left for the agent then).

        Cancelled: preparing kills its git and leaves nothing the lane's next
        prepare cannot clear (see :meth:`WorktreeManager.prepare`).
        """
        worktrees = self.worktrees
        if worktrees is None:
            return True
        self._lone = run.lane if run.conversation_id is None else None
        # Inside the run's budget: preparing its checkouts is part of the run.
        with trio.move_on_at(deadline):
            self.prepared = await worktrees.prepare(run.lane, self.confine)
        prepared = self.prepared
        if prepared is None or trio.current_time() >= deadline:
            return False
        for failure in prepared.failures:
            log.warning("run %s: no private checkout of %s (%s)", run.run_id, failure.source,
                        failure.reason)
        # Before the agent runs: what the run changes is compared with this. What
        # the last run left is read inside a confinement (§13).
        async with self._reading() as reader:
            self._before = await reader.states(
                [(c.name, Path(c.path)) for c in prepared.checkouts],
                places={c.name: c.git for c in prepared.checkouts if c.git})
        names = _names(worktrees)
        self._unready = []
        for failure in prepared.failures:
            name = names.get(failure.source, Path(failure.source).name)
            self._unready.append((name, without_paths(failure.reason, failure.source, name,
                                                      home=worktrees.root.parent)))
        return True

    def refused(self) -> str | None:
        """Why the run must not start (§7 ``error``, no local path): a checkout made
        by an earlier version could not be moved to the conversation's own
        repository (:meth:`WorktreeManager.prepare`; retrying may succeed);
        ``None``: the run goes on."""
        worktrees, prepared = self.worktrees, self.prepared
        if worktrees is None or prepared is None:
            return None
        names = _names(worktrees)
        for failure in prepared.failures:
            if failure.retryable:
                name = names.get(failure.source, Path(failure.source).name)
                said = without_paths(failure.reason, failure.source, name,
                                     home=worktrees.root.parent)
                return f"the private checkout {name} was not ready, so the agent was not " \
                       f"started: {said}"
        return None

    def start_state(self) -> str | None:
        """What :meth:`prepare` found, as the ledger keeps it with the agent's process
        group (:mod:`prohost.engine.run.startstate`); ``None`` without ``--repos``."""
        if self.worktrees is None or self.prepared is None:
            return None
        return start_state(self.prepared, self._before, self._unready)

    def resume(self, text: str) -> None:
        """Take up the checkouts a run began with in an earlier process of the
        harness, from the ledger's :meth:`start_state` of it, in place of
        :meth:`prepare`: :meth:`changes` then says what the run changed since.
        Raises :class:`~prohost.engine.run.startstate.UnreadableStartState`."""
        self.prepared, self._before, self._unready = read_start_state(text)

    async def changes(self) -> list[ChangeEntry] | None:
        """The §7 ``changes``, one entry per checkout in ``--repos`` order; ``None``
        without ``--repos`` (or before :meth:`prepare`). Each checkout is bounded.

        Before them, the lane's branch is brought back to the person's repository
        (:meth:`WorktreeManager.bring_back`). A run without a conversation gets
        its branch there only if it committed something; when it changed nothing
        at all, its worktrees are removed too (:meth:`WorktreeManager.discard`).

        Cancelled: as :meth:`prohost.engine.repos.changes.CheckoutReader.compare`.
        """
        if self.worktrees is None or self.prepared is None:
            return None
        if self._discarded is not None:
            return self._discarded
        if self._lone is None:
            # First: the person's repository gets the conversation's commits on its
            # branch (§13: by that branch alone), whatever the changes say.
            await self.worktrees.bring_back(self.prepared, self.confine, self.scratch_root)
        async with self._reading() as reader:
            found = await reader.changes(self._before, self._unready)
        changes = [self._private(entry) for entry in found]
        order = {name: index for index, name in enumerate(self.worktrees.names)}
        changes.sort(key=lambda entry: order.get(entry.repo, len(order)))
        if self._lone is not None:
            if any(isinstance(entry, CheckoutChanges) and entry.commits for entry in changes):
                # It committed: its branch, in the person's repository too.
                await self.worktrees.bring_back(self.prepared, self.confine,
                                                self.scratch_root)
            elif all(_untouched(entry) for entry in changes) and self.prepared.checkouts \
                    and await self.worktrees.discard(self._lone, self.prepared):
                self._discarded = changes
            # Else files changed and not committed: the worktree stays (its work is
            # nowhere else; collection keeps it while it is dirty), with no branch.
        return changes

    @contextlib.asynccontextmanager
    async def _reading(self) -> AsyncIterator[CheckoutReader]:
        """The checkouts' reader, with the harness's bounds; where its git runs: one
        confinement for all of
        them where runs are confined by bubblewrap (the run's hidden places
        hidden, the checkouts, their repositories and the person's readable,
        nothing writable, no network); else unconfined, with the overrides of
        :mod:`prohost.engine.repos.gitcmd`. Its process ends with the block
        (shielded and bounded when cancelled)."""
        prepared, worktrees = self.prepared, self.worktrees
        if (self.confine is None or self.scratch_root is None or prepared is None
                or worktrees is None):
            yield CheckoutReader(self.bounds, self.env, PLAIN_GIT)
            return
        readable = [Path(c.path) for c in prepared.checkouts]
        readable += [Path(c.git.common_dir) for c in prepared.checkouts if c.git]
        readable += [Path(source) for source in worktrees.repos]
        async with ConfinedGit(self.confine, readable, self.scratch_root) as run_git:
            yield CheckoutReader(self.bounds, self.env, run_git)

    def _private(self, entry: ChangeEntry) -> ChangeEntry:
        """``entry`` naming no local path (§7): the person's own checkouts by their
        names, ``$PROHOST_HOME`` (where the worktrees are) by that word."""
        worktrees = self.worktrees
        assert worktrees is not None
        home = worktrees.root.parent

        def said(text: str) -> str:
            for source, name in zip(worktrees.repos, worktrees.names, strict=True):
                text = without_paths(text, source, name)
            return without_paths(text, home, "$PROHOST_HOME", home=home)

        if isinstance(entry, UnreadableCheckout):
            return UnreadableCheckout(entry.repo, said(entry.error))
        if isinstance(entry, CheckoutChanges) and entry.truncated is not None:
            return attrs.evolve(entry, truncated=said(entry.truncated))
        return entry


def _untouched(entry: ChangeEntry) -> bool:
    """The run left this checkout as it found it: no commit, no file changed (a
    checkout that could not be read may hold anything)."""
    return isinstance(entry, CheckoutChanges) and entry.commits == 0 \
        and not entry.files and not entry.more_files and entry.truncated is None \
        and entry.base == entry.head


def git_confinement(sandbox: Sandbox) -> Confine | None:
    """How the harness's own git runs confined on what a run wrote (§13): with
    bubblewrap, the run's hidden places hidden, nothing writable but the
    folders named; ``None`` where runs are not confined by bubblewrap (the git
    then runs as it always has, with :data:`~prohost.engine.repos.gitcmd.HARDENED`)."""
    support = sandbox.support
    if support is None or support.kind != "bwrap" or not support.bwrap:
        return None
    hidden = hidden_places(sandbox)
    program = support.bwrap

    def confine(argv: list[str], readable: Sequence[Path],
                writable: Sequence[Path]) -> tuple[list[str], int | None]:
        policy = Policy(writable=tuple(writable), readable=tuple(readable), hidden=hidden)
        # The runs' filter on Unix sockets: what a run planted runs with it too.
        fd = seccomp.filter_fd()
        try:
            return confined_command(policy, argv, bwrap=program, seccomp_fd=fd), fd
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise

    return confine


def _names(worktrees: WorktreeManager) -> dict[str, str]:
    """Each ``--repos`` checkout's name in reports (§7 ``repo``), by its path."""
    return dict(zip(map(str, worktrees.repos), worktrees.names, strict=True))
