"""A run's workspace: everything its attempts stand on, made before the agent starts
and taken down after it (the bootstrap, as the Buildkite agent splits it from its
job runner).

:class:`Workspaces` is the harness's, one for every run: what a workspace is made
from (the agent's setup, the base environment, the worktrees, the scratch root and
the sandbox). :meth:`Workspaces.workspace` gives one run's :class:`Workspace`, and
:meth:`Workspace.prepare` makes it: its checkouts (prepared within the run's
deadline), prompt, environment, working folder and scratch folder. Each attempt
then gets its :class:`AttemptPlace` from :meth:`Workspace.open_attempt` (the
account's CLI folder and its login, the MCP wiring, the confinement, §13) and gives
it back with :meth:`Workspace.close_attempt`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs

from prohost.engine.accounts.book import Account
from prohost.engine.agent.brains.base import McpError, McpWiring
from prohost.engine.agent.environment import scratch_folder
from prohost.engine.repos.worktrees import WorktreeManager, lane_folder_name
from prohost.engine.run.checkouts import LaneCheckouts
from prohost.engine.run.confine import (
    RunConfinement,
    RunPlaces,
    Sandbox,
    confine,
    confined_env,
)
from prohost.engine.run.ending import Ending
from prohost.engine.run.execute import AgentSetup
from prohost.engine.run.progress import Progress
from prohost.engine.run.staging import (
    env_for,
    mcp_folder,
    mend_session,
    prompt_for,
    remove_scratch,
    share_login,
    wire_mcp,
    workdir_for,
)
from prohost.engine.sandbox import ConfinementFailed
from prohost.wire.outcomes import NOT_CONFINED, limit_phrase
from prohost.wire.runs import AgentRun, Outcome

log = logging.getLogger("prohost.runner")

__all__ = ["AttemptNotReady", "AttemptPlace", "Workspace", "Workspaces"]

#: An ending of the run's, made with what it changed so far (the runner's).
Ended = Callable[..., Ending]


class AttemptNotReady(Exception):
    """An attempt's places could not be made (its MCP server, its confinement), so
    its agent was not started: ``outcome`` says why."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.error)
        self.outcome = outcome


@attrs.frozen
class AttemptPlace:
    """Where one attempt's agent runs: its environment, MCP wiring, working folder
    and confinement (``None``: runs are not confined), on one account."""

    account: Account
    #: The account's environment before MCP and confinement (where the CLI keeps
    #: its sessions: a brain's running totals are read there).
    account_env: Mapping[str, str]
    env: Mapping[str, str]
    wiring: McpWiring | None
    cwd: Path
    confined: RunConfinement | None
    #: The account's CLI folder of the run's conversation.
    lane_folder: str


@attrs.frozen(eq=False)
class Workspaces:
    """What every run's workspace is made from (handed by the composition root)."""

    setup: AgentSetup
    #: The agents' base environment.
    env: Mapping[str, str]
    #: The lanes' worktrees; ``None`` without ``--repos``.
    worktrees: WorktreeManager | None
    #: Where runs' scratch folders go (``$PROHOST_HOME/runs``).
    scratch_root: Path
    #: How agents are confined (§13).
    sandbox: Sandbox
    #: Whose own folders a confined run is granted (the brain's, or the agent an
    #: ACP command line starts: :meth:`Brain.folders_owner`).
    agent: str

    @property
    def has_checkouts(self) -> bool:
        """Runs work in their conversation's worktrees (``--repos``)."""
        return self.worktrees is not None

    def checkouts(self) -> LaneCheckouts | None:
        """A run's view of its lane's checkouts; ``None`` without ``--repos``."""
        if self.worktrees is None:
            return None
        return LaneCheckouts(self.worktrees, self.setup.bounds, self.env, self.sandbox,
                             self.scratch_root)

    def places(self) -> list[tuple[Path, str]]:
        """The local folders an error's text may name, each with the words the
        server reads instead (§7: no local path)."""
        # The scratch root is $PROHOST_HOME/runs, so its parent is the home, which
        # holds the ledger and the worktrees too.
        places = [(self.scratch_root.parent, "$PROHOST_HOME"),
                  (self.setup.spec.workdir, "<workdir>")]
        if self.worktrees is not None:
            # The person's repositories, by their names in the report (§7 ``repo``).
            places += zip(self.worktrees.repos, self.worktrees.names, strict=True)
        return places

    def workspace(self, run: AgentRun) -> Workspace:
        """``run``'s workspace, not prepared yet (:meth:`Workspace.prepare`): its
        :attr:`Workspace.checkouts` is the run's from now on, so a cancel or a stop
        still reads what it changed."""
        checkouts = self.checkouts() or LaneCheckouts(None, self.setup.bounds, self.env)
        return Workspace(self, run, checkouts)


class Workspace:
    """One run's workspace (see the module docstring)."""

    def __init__(self, of: Workspaces, run: AgentRun, checkouts: LaneCheckouts) -> None:
        self._of = of
        self.run = run
        self.checkouts = checkouts
        # Named by a digest of the run id, never the id itself (§3).
        self.scratch = scratch_folder(of.scratch_root, run.run_id)
        self._lane_folder = lane_folder_name(run.lane)

    async def prepare(self, progress: Progress, deadline: float, ended: Ended,
                      on_ready: Callable[[], None]) -> Ending | None:
        """Make the workspace, or say the run's ending when it cannot be made (its
        checkouts not ready by ``deadline`` or refused, its working folder not made;
        ``ended`` makes that ending). ``on_ready`` is called once the checkouts are
        ready (the run is then ``running``); ``progress`` shows what is prepared.

        Cancelled: the checkouts' prepare is abandoned as
        :meth:`LaneCheckouts.prepare` says; nothing else was made yet.
        """
        of, run, checkouts = self._of, self.run, self.checkouts
        setup = of.setup
        if of.worktrees is not None:
            progress.preparing = "preparing the private checkouts"
            ready = await checkouts.prepare(run, deadline)
            progress.preparing = None
            if not ready:
                # Done after the deadline, or just as it came: no time is left for
                # the agent.
                return ended(Outcome.failure(
                    f"preparing the private checkouts took longer than the run's "
                    f"{limit_phrase(setup.spec.timeout_s)} limit (--timeout), so the agent "
                    "was not started"))
            refused = checkouts.refused()
            if refused is not None:
                # A checkout that must not be handed over as it is (§13): the run
                # fails before anything of it starts, and may be sent again.
                return ended(Outcome.failure(refused, retryable=True))
            on_ready()
        try:
            # Abandoning is safe: a mkdir -p touches nothing trio owns, and the spawn
            # that needs the folder is not attempted.
            await setup.spec.folder.ensure(setup.bounds)
        except OSError as exc:
            # Named in the local log; the server hears the flag (§7: no local path).
            log.warning("run %s: could not create the working directory %s: %s",
                        run.run_id, setup.spec.workdir, exc)
            return ended(Outcome.failure(
                "could not create the working directory (--workdir): "
                f"{exc.strerror or type(exc).__name__}"), changes=await checkouts.changes())
        return None

    @property
    def prompt(self) -> str:
        """The prompt the agent is given (§5.3)."""
        of = self._of
        return prompt_for(self.run, of.setup.spec, self.checkouts.prepared,
                          confined=of.sandbox.confines)

    async def open_attempt(self, account: Account, session: str | None, tried: int,
                           deadline: float) -> AttemptPlace:
        """The places of an attempt on ``account`` (``tried`` accounts were tried
        before it): the conversation's own CLI folder of the account (its login
        shared, §13), the MCP wiring, the confinement made anew, and the agent's
        saved ``session`` mended where its brain asks. Raises
        :class:`AttemptNotReady` when the MCP server or the confinement cannot be
        made. Cancelled: what was made is closed by the caller's
        :meth:`close_attempt` only once this returned; a confinement being made is
        closed by :func:`confine` itself."""
        of, run = self._of, self.run
        setup = of.setup
        env = env_for(run, setup.spec, of.env, self.checkouts.prepared)
        account_env = {**env, **account.env(of.agent, self._lane_folder)}
        attempt_env = dict(account_env)
        await share_login(account, of.agent, of.env, setup.bounds, self._lane_folder)
        try:
            # Per account: a brain may build its configuration over the account's
            # own folder (Codex's CODEX_HOME overlay).
            wiring = await wire_mcp(run, setup.brain, mcp_folder(self.scratch, tried),
                                    attempt_env, setup.bounds)
        except McpError as exc:
            raise AttemptNotReady(Outcome.failure(
                f"the run's MCP server could not be prepared, so the agent was not "
                f"started: {exc}")) from exc
        if wiring is not None:
            attempt_env.update(wiring.env)
        try:
            # The account's own folders (a brain's MCP overlay of them is in the
            # scratch folder, granted as a whole).
            confined = await self._confine(account_env, deadline)
        except ConfinementFailed as exc:
            # Never unconfined in its place: the run fails, saying why (§13). Nothing
            # ran and the fault is this machine's (a hung or failing disk):
            # retryable, like a `started` that could not be written.
            raise AttemptNotReady(Outcome.failure(f"{NOT_CONFINED}: {exc}",
                                                  retryable=True)) from exc
        attempt_env = confined_env(attempt_env, confined, of.sandbox.allow_write)
        await mend_session(setup.brain, session, attempt_env, confined, setup.bounds)
        cwd = workdir_for(setup.spec, self.checkouts.prepared,
                          None if confined is None or of.worktrees is None
                          else confined.tmpdir)
        return AttemptPlace(account, account_env, attempt_env, wiring, cwd, confined,
                            self._lane_folder)

    async def close_attempt(self, place: AttemptPlace) -> None:
        """Take an attempt's places down: its confinement closed, and a refresh the
        attempt made of the login shared now, before its spent refresh token logs
        the person out. Cancelled: as the login's sharing (bounded, shielded)."""
        if place.confined is not None:
            place.confined.close()
        of = self._of
        await share_login(place.account, of.agent, of.env, of.setup.bounds,
                          place.lane_folder)

    async def close(self) -> None:
        """Remove the run's scratch folder. Cancelled: bounded and shielded."""
        of = self._of
        await remove_scratch(self.run, self.scratch, of.setup.bounds,
                             made=of.sandbox.tmp_on_disk)

    async def _confine(self, env: Mapping[str, str],
                       deadline: float) -> RunConfinement | None:
        """The attempt's confinement (§13), made anew, ``None`` when runs are not
        confined; raises :class:`ConfinementFailed`. Cancelled: as :func:`confine`."""
        of = self._of
        if not of.sandbox.confines:
            return None
        prepared = self.checkouts.prepared
        places = RunPlaces(
            workdir=None if of.worktrees is not None else of.setup.spec.workdir,
            worktrees=tuple(Path(c.path) for c in prepared.checkouts) if prepared else (),
            lane_folder=prepared.folder if prepared else None,
            scratch=self.scratch, brain=of.agent, env=env,
            git=tuple(c.git for c in prepared.checkouts if c.git) if prepared else (),
            lane=self.run.lane)
        return await confine(of.sandbox, places, deadline, of.setup.bounds)
