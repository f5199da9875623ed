"""One run executed with a brain: prompt → environment → spawn → reply → Outcome.

The brain (:mod:`prohost.engine.agent.brains`) says how to invoke its CLI and how to read what
it prints; everything else is the same for every CLI and lives here: the prompt,
the environment (markers in, secrets out: :mod:`prohost.engine.agent.environment`), the
run's private MCP folder, the one retry with a fresh session when a resumed one is
rejected (inside the same deadline), and turning however the process ended into
words for the sender.

Every way a run can end becomes an :class:`Outcome`, never an exception, except
cancellation: that belongs to the caller, which reports it (§6).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import attrs
import trio

from prohost.engine.accounts.book import DEFAULT_ACCOUNT, Account
from prohost.engine.accounts.limits import LimitNotice
from prohost.engine.agent.brains.base import Brain, McpError, McpWiring, one_line
from prohost.engine.agent.brains.plain import PlainBrain
from prohost.engine.agent.environment import agent_env, make_private_folder
from prohost.engine.agent.process import ProcessGroups, run_agent
from prohost.engine.agent.reply import MAX_REPLY_BYTES
from prohost.engine.blocking import Bounds
from prohost.engine.repos.worktrees import RUN_REPOS_ENV, WorktreeManager
from prohost.engine.run.checkouts import LaneCheckouts
from prohost.engine.run.ending import failure_from_result
from prohost.engine.run.progress import Progress
from prohost.engine.run.prompt import PromptContext, build_prompt
from prohost.engine.run.workfolder import WorkFolder
from prohost.options import Options
from prohost.wire.outcomes import limit_phrase
from prohost.wire.runs import AgentRun, Outcome
from prohost.wire.timeline import ToolEvent
from prohost.wire.usage import Usage

log = logging.getLogger("prohost.execute")

#: Bound on removing a run's MCP folder after the run (s): it holds a few small
#: files, and the run's report waits for it.
SCRATCH_REMOVE_S = 5.0


@attrs.frozen
class ExecSpec:
    """How this harness runs agents: the same for every run."""

    command: str
    """The ``--exec`` line, run through ``/bin/sh -c``."""
    workdir: Path
    timeout_s: float
    """0 = no total limit."""
    idle_timeout_s: float
    """0 = no idle limit."""
    parallel: bool
    """``--concurrency`` above 1: other runs may share the machine."""
    secrets: tuple[str, ...]
    """The token and secret: no environment variable whose value contains one reaches the agent."""
    folder: WorkFolder = attrs.field(
        eq=False, default=attrs.Factory(lambda spec: WorkFolder(spec.workdir), takes_self=True))
    """``workdir``, made once for every run of this spec."""

    @classmethod
    def from_options(cls, options: Options, secrets: tuple[str, ...]) -> ExecSpec:
        """The spec ``agent run``'s flags describe."""
        return cls(command=options.exec_command, workdir=options.workdir,
                   timeout_s=options.timeout_s, idle_timeout_s=options.idle_timeout_s,
                   parallel=options.concurrency > 1, secrets=secrets)


@attrs.frozen
class AccountPlan:
    """Which account a run starts on, and how it moves when that one is limited."""

    #: The account the first attempt uses (its session is ``execute``'s ``session_id``).
    account: Account
    #: Told what every attempt on an account learned about its limit (may be None).
    #: Cancelled: as the caller's own ledger step (shielded, bounded).
    learned: Callable[[Account, LimitNotice | None], Awaitable[None]]
    #: The next usable account not in the given names, with the lane's session
    #: there, or ``None`` when there is none; it may wait, until the given trio
    #: deadline at most, for a limit to reset. Cancelled: nothing to undo.
    another: Callable[[frozenset[str], float],
                      Awaitable[tuple[Account, str | None] | None]]


async def execute_plain(
    run: AgentRun,
    spec: ExecSpec,
    *,
    groups: ProcessGroups,
    on_spawn: Callable[[int], Awaitable[None]] | None = None,
    base_env: Mapping[str, str] | None = None,
) -> Outcome:
    """:func:`execute` with the plain brain running ``spec.command``.

    Cancelled: as :func:`execute` (the agent's group is stopped, then the
    cancellation propagates).
    """
    return await execute(
        run, spec, PlainBrain(spec.command), groups=groups, on_spawn=on_spawn,
        base_env=base_env,
    )


async def execute(
    run: AgentRun,
    spec: ExecSpec,
    brain: Brain,
    *,
    groups: ProcessGroups,
    session_id: str | None = None,
    progress: Progress | None = None,
    on_spawn: Callable[[int], Awaitable[None]] | None = None,
    on_events: Callable[[list[ToolEvent]], None] | None = None,
    base_env: Mapping[str, str] | None = None,
    scratch: Path | None = None,
    worktrees: WorktreeManager | None = None,
    accounts: AccountPlan | None = None,
    bounds: Bounds | None = None,
    on_prepared: Callable[[], None] | None = None,
    usage_before: Callable[[str], Awaitable[Usage]] | None = None,
) -> Outcome:
    """Run ``run`` with ``brain`` and say how it went.

    With ``accounts``, the agent runs with the plan's account's variables
    (:meth:`Account.env`); an attempt that ends because that account reached its
    usage limit is run again on each other usable account once (fresh session
    there), inside the same deadline, and only the last attempt's outcome is
    returned (``progress.account`` names its account).

    Its file steps (the working folder, the MCP folder and its removal) are
    bounded by ``bounds`` (the harness's, which the second signal hurries; a
    fresh one if ``None``): a hung disk fails the run instead of holding it.

    ``session_id`` is resumed; a brain that rejects it is retried once with a
    fresh session, inside the same deadline (``--timeout`` bounds the run), and
    the outcome keeps ``session_id`` unless a new session really started.
    Preparing the worktrees counts against the same deadline: one that outlives
    it fails the run with its own error, and the agent is never spawned;
    ``on_prepared`` is called once they are ready (the run is then ``running``
    rather than ``preparing``). ``scratch`` is a folder private to this run for
    the brain's MCP configuration, removed afterwards; a run with ``mcp`` whose
    configuration cannot be prepared fails closed: the agent is never spawned.
    Failures (cannot start, non-zero exit, signal, timeouts, the CLI's own
    errors) come back as ``Outcome.failure(..., retryable=False)``, never as
    exceptions.

    Cancelled: the agent's process group is stopped (SIGTERM, then SIGKILL after
    ``groups.grace_s``, shielded and bounded) before the ``trio.Cancelled`` leaves
    this function; no outcome is produced, since the caller reports the cancel
    (``progress`` still says which session the agent had).
    """
    progress = progress if progress is not None else Progress()
    bounds = bounds if bounds is not None else Bounds()
    # The budget starts now, not at spawn: preparing the run is part of it.
    started = trio.current_time()
    deadline = started + spec.timeout_s if spec.timeout_s > 0 else math.inf

    def finished(outcome: Outcome) -> Outcome:
        # §7: the run's usage is every attempt's, summed (a fresh retry, a fail-over).
        return attrs.evolve(outcome, duration_ms=round((trio.current_time() - started) * 1000),
                            usage=progress.spent.known())

    lane = LaneCheckouts(worktrees, bounds, base_env)
    if not await lane.prepare(run, deadline, progress):
        # Done after the deadline, or just as it came: no time is left for the agent.
        return finished(Outcome.failure(
            f"preparing the private checkouts took longer than the run's "
            f"{limit_phrase(spec.timeout_s)} limit (--timeout), so the agent was not started"))
    if on_prepared is not None:
        on_prepared()
    prepared = lane.prepared

    async def done(outcome: Outcome) -> Outcome:
        changes = await lane.changes()  # bounded per checkout: the report waits seconds
        return attrs.evolve(finished(outcome), changes=changes)

    prompt = build_prompt(
        run,
        PromptContext(
            timeout_s=spec.timeout_s,
            idle_timeout_s=spec.idle_timeout_s,
            parallel=spec.parallel,
            checkouts=prepared.checkouts if prepared else (),
            checkout_failures=prepared.failures if prepared else (),
        ),
    )
    env = agent_env(os.environ if base_env is None else base_env, run.run_id, spec.secrets)
    if prepared is not None and prepared.folder is not None:
        env[RUN_REPOS_ENV] = str(prepared.folder)
    try:
        # Abandoning is safe: a mkdir -p touches nothing trio owns, and the spawn
        # that needs the folder is not attempted.
        await spec.folder.ensure(bounds)
    except OSError as exc:
        return await done(Outcome.failure(
            f"could not create the working directory {spec.workdir}: {exc.strerror or exc}"
        ))
    try:
        account = accounts.account if accounts is not None else Account(DEFAULT_ACCOUNT)
        tried: set[str] = set()
        while True:
            progress.account = account.name
            attempt_env = {**env, **account.env(brain.name)}
            try:
                # Per account: a brain may build its configuration over the
                # account's own folder (Codex's CODEX_HOME overlay).
                wiring = await _wire_mcp(
                    run, brain, None if scratch is None
                    else scratch / f"account-{len(tried)}" if tried else scratch,
                    attempt_env, bounds)
            except McpError as exc:
                # After a fail-over, the session is the new account's own, untouched:
                # kept, so that the lane's turn does not forget it (§12).
                return await done(Outcome.failure(
                    f"the run's MCP server could not be prepared, so the agent was not "
                    f"started: {exc}", session_id=progress.session_id,
                ))
            if wiring is not None:
                attempt_env.update(wiring.env)
            outcome = await _session_attempts(_Spawn(
                run, spec, brain, prompt, attempt_env, wiring, deadline, groups, progress,
                on_spawn, on_events, usage_before, bounds), session_id)
            if accounts is None:
                break
            await accounts.learned(account, progress.limit)
            if not progress.ended_by_limit:
                break
            tried.add(account.name)
            # Another account can take the run while someone may still use the
            # answer: a limit is never the run's own fault.
            outcome = attrs.evolve(outcome, retryable=True)
            if trio.current_time() >= deadline:
                break
            following = await accounts.another(frozenset(tried), deadline)
            if following is None:
                break
            log.warning("run %s: account %s is at its usage limit (%s); running it again "
                        "on account %s", run.run_id, account.name, outcome.error,
                        following[0].name)
            account, session_id = following
            progress.session_id = session_id
        return await done(outcome)
    finally:
        # Also after a configuration that failed half-way: the folder is this run's
        # alone (see prohost.engine.agent.environment.scratch_folder), so nothing else can be in it.
        if scratch is not None and run.mcp is not None:
            # Bounded (Bounds.run is shielded): abandoning is safe, the folder is
            # no one else's, and one a hung disk leaves behind (with its 0600
            # token) is swept at the next start (prohost.engine.supervisor.upkeep).
            with contextlib.suppress(OSError):
                await bounds.file_step(shutil.rmtree, scratch, True, limit_s=SCRATCH_REMOVE_S,
                                       what="removing the run's MCP folder")


@attrs.frozen
class _Spawn:
    """What every attempt of one run on one account shares; only the session differs."""

    run: AgentRun
    spec: ExecSpec
    brain: Brain
    prompt: str
    env: Mapping[str, str]
    wiring: McpWiring | None
    deadline: float
    groups: ProcessGroups
    progress: Progress
    on_spawn: Callable[[int], Awaitable[None]] | None
    on_events: Callable[[list[ToolEvent]], None] | None
    #: What a resumed session had reached, for a brain reporting running totals.
    usage_before: Callable[[str], Awaitable[Usage]] | None = None
    #: The harness's bounds, to make the working folder again if it vanished.
    bounds: Bounds = attrs.Factory(Bounds)


async def _session_attempts(spawn: _Spawn, session_id: str | None) -> Outcome:
    """One attempt resuming ``session_id``, and a fresh one if the agent rejects it.

    A brain guesses a rejection from a non-zero exit before the CLI announced a
    session, and a CLI that cannot start at all ends the same way (``claude: not
    found`` after an upgrade; a refused flag: Claude's ``error: unknown option``,
    exit 1, github.com/cline/cline/issues/4566, codex's clap ``error: unexpected
    argument``, exit 2). So if the fresh attempt starts no session either, the
    session was not the trouble: the first failure is reported and the lane keeps
    ``session_id``.

    Cancelled: as :func:`execute`; ``progress.session_id`` stays ``session_id``
    until a fresh session is seen.
    """
    first = await _attempt(spawn, session_id)
    if not first.rejected:
        return first.outcome
    log.info("run %s: the agent did not take session %s; trying a fresh one",
             spawn.run.run_id, session_id)
    fresh = await _attempt(spawn, None)
    if fresh.started:  # a new session replaces the refused one (the outcome has it)
        return fresh.outcome
    log.info("run %s: no fresh session either; keeping %s", spawn.run.run_id, session_id)
    spawn.progress.session_id = session_id
    if fresh.timed_out:  # the run's limit ended it: the sender must hear that
        return attrs.evolve(fresh.outcome, session_id=session_id)
    return first.outcome


async def _wire_mcp(run: AgentRun, brain: Brain, scratch: Path | None,
                    env: Mapping[str, str], bounds: Bounds) -> McpWiring | None:
    if run.mcp is None:
        return None
    if scratch is None:
        raise McpError("no private folder was given for its configuration")
    try:
        # Abandoning either is safe: they write only in the run's own folder,
        # which execute removes, or the next start's sweep does.
        await bounds.file_step(make_private_folder, scratch,
                               what="creating the run's MCP folder")
        return await bounds.file_step(brain.wire_mcp, run.mcp, scratch, env,
                                      what="writing the run's MCP configuration")
    except OSError as exc:
        raise McpError(f"could not write its configuration in {scratch}: "
                       f"{exc.strerror or exc}") from None


@attrs.frozen
class _Tried:
    """One attempt's outcome; whether the brain read it as the session refused, the
    CLI announced a session (got past starting), a time limit stopped it."""

    outcome: Outcome
    rejected: bool = False
    started: bool = False
    timed_out: bool = False


async def _attempt(spawn: _Spawn, session_id: str | None, *, again: bool = False) -> _Tried:
    """One spawn of the agent, resuming ``session_id`` (``None``: a fresh session).
    When no agent could start in a working folder made by an earlier run (it was
    removed since), the folder is made again and the spawn tried once more
    (``again``).

    Cancelled: as :func:`execute` (the attempt's process group is gone first).
    """
    spec, brain, progress, deadline = spawn.spec, spawn.brain, spawn.progress, spawn.deadline
    on_spawn, on_events = spawn.on_spawn, spawn.on_events
    turn = brain.new_turn()
    if session_id is not None and spawn.usage_before is not None:
        turn.usage_before = await spawn.usage_before(session_id)
    progress.session_totals = None
    progress.attempts += 1
    progress.limit, progress.ended_by_limit = None, False
    progress.last_output = trio.current_time()
    if session_id is not None:
        progress.session_id = session_id

    def read_line(line: bytes) -> None:
        events = turn.feed(line)
        if turn.session_id is not None:
            progress.session_id = turn.session_id
        progress.activity = turn.activity
        progress.model = turn.model or progress.model
        if events and on_events is not None:
            on_events(events)

    spawned = False

    async def spawned_as(pgid: int) -> None:
        nonlocal spawned
        spawned = True
        if on_spawn is not None:
            await on_spawn(pgid)

    try:
        result = await run_agent(
            brain.command(session_id=session_id, mcp=spawn.wiring),
            stdin_text=spawn.prompt,
            cwd=spec.workdir,
            env=spawn.env,
            groups=spawn.groups,
            deadline=deadline,
            idle_timeout_s=spec.idle_timeout_s,
            # A streaming brain reads its reply from the events; keeping a copy
            # of the raw stream as well would only cost memory.
            max_stdout_bytes=0 if brain.streams else MAX_REPLY_BYTES,
            on_spawn=spawned_as,
            on_stdout_line=read_line if brain.streams else None,
            on_output=lambda at: setattr(progress, "last_output", at),
        )
    except OSError as exc:
        if spawned:
            raise  # from on_spawn: the caller's own failure, not the agent's
        folder = spec.folder
        if isinstance(exc, FileNotFoundError) and folder.made and not again:
            folder.forget()  # made by an earlier run, maybe removed since
            try:
                await folder.ensure(spawn.bounds)
            except OSError as made:
                exc = made
            else:
                return await _attempt(spawn, session_id, again=True)
        # The spawn itself failed: /bin/sh missing, the directory vanished between
        # mkdir and spawn, the process table full (EAGAIN). No agent ran, so the
        # session it was to resume is untouched and stays the lane's.
        return _Tried(Outcome.failure(
            f"could not start the agent in {spec.workdir}: {exc.strerror or exc}",
            session_id=session_id,
        ))
    # The one the CLI announced, else the one it was to resume (a fresh one: none).
    session = turn.session_id or session_id
    progress.spent += turn.usage()
    progress.session_totals = turn.session_totals()
    progress.limit = turn.limit
    rejected = (
        session_id is not None
        and result.timed_out is None
        and trio.current_time() < deadline
        and turn.resume_rejected(result)
    )
    if result.timed_out is None:
        outcome = turn.finish(result)
        progress.ended_by_limit = turn.ended_by_limit(outcome)
        if outcome is not None:
            return _Tried(attrs.evolve(outcome, session_id=outcome.session_id or session),
                          rejected=rejected, started=turn.started)
    outcome = failure_from_result(result, timeout_s=spec.timeout_s,
                                   idle_timeout_s=spec.idle_timeout_s)
    if result.timed_out is not None and turn.last_error and outcome.error:
        outcome = attrs.evolve(outcome, error=f"{outcome.error}; its last error: "
                               f"{one_line(turn.last_error, 300)}")
    return _Tried(attrs.evolve(outcome, session_id=session), rejected=rejected,
                  started=turn.started, timed_out=result.timed_out is not None)
