"""One attempt of a run: one account, one session, and the fresh retry once.

The :class:`~prohost.engine.run.runner.Runner` decides everything before an
attempt starts — the account, the session to resume, the prompt, the environment,
the MCP wiring, the deadline — and hands it over as one frozen :class:`Attempt`.
:func:`execute` spawns the agent for it, reads what it prints through the brain
(:mod:`prohost.engine.agent.brains`), and returns an :class:`AttemptResult`: the
outcome in words, the session the lane keeps, what the attempt spent, and what the
CLI said of its account's usage limit. A resumed session the CLI rejects is tried
once more with a fresh session, inside the same deadline; that is all the
attempt decides by itself.

It spawns the agent and, before it watches it, awaits the run's ``on_spawn`` step
with the spawned agent (its process group must be durable before its output is
read, §7; the run also keeps the agent's watch, whose ``leader_exited`` its cancel
path reads). What a watcher may want to see while the agent works (session,
activity, model, last output) the agent room's
:class:`~prohost.engine.agent.reading.OutputReader` writes into the run's
:class:`~prohost.engine.run.progress.Progress` (a
:class:`~prohost.engine.agent.reading.Seen`), and the tool calls it reads go to the
run's timeline sink (§8): data out, never a call back into the run.

Every way an attempt can end becomes an :class:`AttemptResult`, never an
exception, except cancellation (the caller reports it, §6) and a failure of
``on_spawn`` (the caller's own step, re-raised).
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import attrs
import trio

from prohost.engine.accounts.limits import LimitNotice
from prohost.engine.agent.brains.base import Brain, McpWiring, Turn
from prohost.engine.agent.launch import Launch, ProcessLimits
from prohost.engine.agent.process import AgentWatch, ProcessGroups, ProcessResult, start_agent
from prohost.engine.agent.reading import OutputReader, ToolEventSink
from prohost.engine.agent.reply import MAX_REPLY_BYTES
from prohost.engine.agent.stderrtail import write_tail
from prohost.engine.blocking import Bounds
from prohost.engine.run.ending import failure_from_result
from prohost.engine.run.progress import Progress
from prohost.engine.run.workfolder import WorkFolder
from prohost.engine.sandbox import Confinement
from prohost.options import Options
from prohost.wire.outcomes import NOT_CONFINED, budget_reached
from prohost.wire.runs import AgentRun, Outcome
from prohost.wire.usage import Usage

log = logging.getLogger("prohost.execute")


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
    stderr_home: Path | None = None
    """Where each run's stderr tail is kept (``$PROHOST_HOME``); ``None``: nowhere."""

    @classmethod
    def from_options(cls, options: Options, secrets: tuple[str, ...]) -> ExecSpec:
        """The spec ``agent run``'s flags describe."""
        return cls(command=options.exec_command, workdir=options.workdir,
                   timeout_s=options.timeout_s, idle_timeout_s=options.idle_timeout_s,
                   parallel=options.concurrency > 1, secrets=secrets,
                   stderr_home=options.home)


@attrs.frozen(eq=False)
class AgentSetup:
    """How this harness starts agents, the same for every attempt: the brain, the
    spec, the process groups it records every agent in, and the bounds of its file
    steps (the second signal hurries them)."""

    brain: Brain
    spec: ExecSpec
    groups: ProcessGroups
    bounds: Bounds = attrs.Factory(Bounds)


@attrs.frozen
class Attempt:
    """One attempt of a run, decided before it starts: the account's environment
    and MCP wiring are in ``env`` and ``wiring``; only the session may change
    inside (a rejected resume is retried fresh)."""

    run: AgentRun
    prompt: str
    env: Mapping[str, str]
    #: The session to resume (``None``: a fresh one).
    session_id: str | None
    #: The trio time by which the run must be over (``--timeout``; ``inf``: none).
    deadline: float
    wiring: McpWiring | None = None
    #: For a CLI that reports its session's running totals (Codex): what the
    #: resumed session had reached before this attempt.
    usage_before: Usage | None = None
    #: What the attempt may spend: what is left of the run's ``--max-cost`` after
    #: its earlier attempts (§12: the budget caps the run, not each attempt);
    #: ``None``: no budget, or all of it.
    max_cost_usd: float | None = None
    #: The confinement its agent is spawned in (docs/protocol.md §13); ``None``: none.
    #: The runner made it and closes it.
    confinement: Confinement | None = None
    #: Where the agent starts (§5.3): the conversation's worktree of the first
    #: ``--repos`` checkout (:func:`prohost.engine.run.staging.workdir_for`);
    #: ``None``: the spec's ``--workdir``.
    cwd: Path | None = None


@attrs.frozen
class AttemptResult:
    """What one attempt ended with, for the runner to finish the run with."""

    #: How it went, in the brain's words (a reply, capped, or a failure), or the
    #: harness's for a process that ended without the brain's say (a timeout, a
    #: signal, an exit status, a spawn that failed). Its ``session_id``, usage,
    #: duration, account and changes are the runner's to set.
    outcome: Outcome
    #: The session the lane's next turn resumes: the one the CLI announced, else the
    #: one it was to resume (a rejected one is kept when a fresh one did not start
    #: either: the failure was not the session's).
    session_id: str | None
    #: An agent process was spawned (a spawn that failed starts none).
    started: bool = False
    #: What this attempt used, its fresh retry included (§7 ``usage``).
    spent: Usage = attrs.Factory(Usage)
    #: The session's running totals after it, for a CLI that reports those.
    session_totals: Usage | None = None
    #: What the CLI said of its account's usage limit (§12).
    limit: LimitNotice | None = None
    #: It failed because its account reached its usage limit: another may take it.
    ended_by_limit: bool = False
    #: The CLI stopped it at its budget, or nothing was left of the budget to start
    #: it with (§12): the runner words the failure.
    reached_budget: bool = False


async def execute(
    attempt: Attempt,
    setup: AgentSetup,
    progress: Progress,
    on_spawn: Callable[[AgentWatch], Awaitable[None]],
    timeline: ToolEventSink | None = None,
) -> AttemptResult:
    """Run the agent for ``attempt`` and say how it went.

    ``attempt.session_id`` is resumed; a CLI that rejects it is run again once with
    a fresh session, inside the same deadline, and the result keeps the rejected
    session unless a new one really started. ``on_spawn`` is awaited with each
    agent's watch (its ``pgid`` the process group) before its output is read; if it
    raises, the group is killed and the exception propagates (the caller's step
    failed, not the agent). The watch's ``leader_exited`` says when the agent has
    finished (see :func:`~prohost.engine.agent.process.start_agent`).
    Failures of the agent (cannot start, non-zero exit, signal, timeouts, the CLI's
    own errors) come back in the result, never as exceptions.

    Of ``progress`` this writes the session, the activity, the model, the last
    output's time and the count of spawns tried (see :class:`Progress`).

    Cancelled: the agent's process group is stopped (SIGTERM, then SIGKILL after
    ``setup.groups.grace_s``, shielded and bounded) before the ``trio.Cancelled``
    leaves this function; nothing is returned, since the caller reports the cancel
    (``progress.session_id`` says which session the agent had).
    """
    progress.session_id = attempt.session_id
    if attempt.max_cost_usd == 0:
        # Nothing left of the run's budget (§12: it covers every attempt): a CLI
        # given 0 would start and spend all the same, so none is started.
        return AttemptResult(outcome=Outcome.failure(budget_reached(None, None)),
                             session_id=attempt.session_id, reached_budget=True)
    first = await _try(attempt, setup, progress, on_spawn, timeline, attempt.session_id)
    if not first.rejected:
        return _result(first, first, first.spent)
    left = left_of(attempt.max_cost_usd, first.spent)
    if left == 0:
        # The refused resume spent what was left: the run ends at its budget, with
        # no fresh session started for nothing.
        return attrs.evolve(_result(first, first, first.spent), reached_budget=True)
    log.info("run %s: the agent did not take session %s; trying a fresh one",
             attempt.run.run_id, attempt.session_id)
    fresh = await _try(attempt, setup, progress, on_spawn, timeline, None,
                       max_cost_usd=left)
    spent = first.spent + fresh.spent
    if fresh.turn.started:  # a new session replaces the refused one
        return _result(fresh, fresh, spent)
    # A CLI that cannot start at all ends the same way as a rejected resume
    # (``claude: not found`` after an upgrade; a refused flag: Claude's ``error:
    # unknown option``, exit 1, github.com/cline/cline/issues/4566, codex's clap
    # ``error: unexpected argument``, exit 2). So when the fresh try starts no
    # session either, the session was not the trouble: the lane keeps it, and the
    # first failure is reported — unless the run's limit ended the fresh try, which
    # the sender must hear.
    log.info("run %s: no fresh session either; keeping %s", attempt.run.run_id,
             attempt.session_id)
    progress.session_id = attempt.session_id
    if fresh.timed_out:
        return _result(fresh, fresh, spent, session_id=attempt.session_id)
    return _result(first, fresh, spent)


@attrs.frozen
class _Tried:
    """One spawn's reading: its outcome, the turn that read it, and how it ended."""

    outcome: Outcome
    turn: Turn
    #: The session it was to resume (``None``: a fresh one).
    resumed: str | None
    #: An agent ran (the spawn worked) and its ending was read.
    spawned: bool = False
    rejected: bool = False
    timed_out: bool = False
    ended_by_limit: bool = False

    @property
    def spent(self) -> Usage:
        return self.turn.usage() if self.spawned else Usage()

    @property
    def session_id(self) -> str | None:
        """The one the CLI announced, else the one it was to resume."""
        return self.turn.session_id or self.resumed


def _result(reported: _Tried, last: _Tried, spent: Usage, *,
            session_id: str | None = None) -> AttemptResult:
    """The attempt's result: ``reported``'s outcome and session (or ``session_id``),
    and what the ``last`` try learned of the session's totals and the account."""
    return AttemptResult(
        outcome=reported.outcome,
        session_id=session_id if session_id is not None else reported.session_id,
        started=reported.spawned or last.spawned,
        spent=spent,
        session_totals=last.turn.session_totals() if last.spawned else None,
        limit=last.turn.limit if last.spawned else None,
        ended_by_limit=last.ended_by_limit,
        reached_budget=reported.spawned and reported.turn.reached_budget,
    )


def left_of(budget_usd: float | None, spent: Usage) -> float | None:
    """What is left of ``budget_usd`` after ``spent`` (at least 0, to the cent's
    hundredth the CLI is given); ``None``: no budget."""
    if budget_usd is None:
        return None
    return max(0.0, round(budget_usd - (spent.cost_usd or 0.0), 4))


async def _try(attempt: Attempt, setup: AgentSetup, progress: Progress,
               on_spawn: Callable[[AgentWatch], Awaitable[None]],
               timeline: ToolEventSink | None, session_id: str | None, *,
               again: bool = False, max_cost_usd: float | None = None) -> _Tried:
    """One spawn of the agent, resuming ``session_id`` (``None``: a fresh session).
    When no agent could start in a working folder made by an earlier run (it was
    removed since), the folder is made again and the spawn tried once more
    (``again``).

    Cancelled: as :func:`execute` (the attempt's process group is gone first).
    """
    brain, spec = setup.brain, setup.spec
    cwd = attempt.cwd if attempt.cwd is not None else spec.workdir
    if max_cost_usd is None:
        max_cost_usd = attempt.max_cost_usd
    turn = brain.new_turn()
    if session_id is not None and attempt.usage_before is not None:
        turn.usage_before = attempt.usage_before
    progress.attempts += 1
    progress.last_output = trio.current_time()
    # The agent's output is read in the agent room, into the run's Progress.
    output = OutputReader(progress, turn if brain.streams else None, timeline)
    spawned = False
    conversation = turn.conversation(attempt.prompt, session_id, cwd, attempt.wiring,
                                     attempt.env)
    try:
        async with start_agent(
            Launch(command=brain.command(session_id=session_id, mcp=attempt.wiring,
                                         max_cost_usd=max_cost_usd),
                   stdin_text=attempt.prompt, cwd=cwd, env=attempt.env,
                   conversation=conversation, confinement=attempt.confinement),
            setup.groups,
            ProcessLimits(deadline=attempt.deadline, idle_timeout_s=spec.idle_timeout_s,
                          # A streaming brain reads its reply from the events; keeping
                          # a copy of the raw stream as well would only cost memory.
                          max_stdout_bytes=0 if brain.streams else MAX_REPLY_BYTES),
            output,
        ) as agent:
            spawned = True
            await on_spawn(agent)
            result = await agent.finish()
    except subprocess.SubprocessError as exc:
        # Only the child's step before exec raises this (Popen's "Exception occurred
        # in preexec_fn"): the confinement could not be applied, so nothing ran, and
        # nothing runs unconfined in its place.
        log.warning("run %s: could not confine the agent: %s", attempt.run.run_id, exc)
        return _Tried(Outcome.failure(f"{NOT_CONFINED}: {exc}", retryable=True), turn,
                      session_id)
    except OSError as exc:
        if spawned:
            raise  # from on_spawn: the caller's own failure, not the agent's
        folder = spec.folder
        in_workdir = cwd == spec.workdir
        if isinstance(exc, FileNotFoundError) and in_workdir and folder.made and not again:
            folder.forget()  # made by an earlier run, maybe removed since
            try:
                await folder.ensure(setup.bounds)
            except OSError as made:
                exc = made
            else:
                return await _try(attempt, setup, progress, on_spawn, timeline, session_id,
                                  again=True, max_cost_usd=max_cost_usd)
        # The spawn itself failed: /bin/sh missing, the directory vanished between
        # mkdir and spawn, the process table full (EAGAIN). No agent ran, so the
        # session it was to resume is untouched and stays the lane's.
        # The folder is named here, in the local log; the server hears the flag
        # (§7: no text sent to it names a local path).
        log.warning("run %s: could not start the agent in %s: %s", attempt.run.run_id,
                    cwd, exc)
        where = ("the working directory (--workdir)" if in_workdir
                 else "its private checkout of the first --repos entry")
        return _Tried(Outcome.failure(
            f"could not start the agent in {where}: "
            f"{exc.strerror or type(exc).__name__}"), turn, session_id)
    await _keep_stderr(attempt.run.run_id, result, setup)
    return _read(result, turn, session_id, attempt.deadline, setup)


async def _keep_stderr(run_id: str, result: ProcessResult, setup: AgentSetup) -> None:
    """Keep the attempt's stderr tail for ``agent runs --show`` (a later attempt's
    replaces it). Never raises: it is for a person, not for the run.

    Cancelled: as :meth:`Bounds.file_step` (abandoning a plain file write is safe).
    """
    home = setup.spec.stderr_home
    if home is None or not result.stderr_tail:
        return
    try:
        await setup.bounds.file_step(write_tail, home, run_id, result.stderr_tail,
                                     what="keeping the agent's stderr")
    except OSError as exc:
        log.warning("run %s: could not keep its agent's stderr: %s", run_id, exc)


def _read(result: ProcessResult, turn: Turn, session_id: str | None, deadline: float,
          setup: AgentSetup) -> _Tried:
    """What one spawned agent's ending says: the brain's outcome when it has one,
    else the harness's words for how the process ended."""
    spec = setup.spec
    rejected = (
        session_id is not None
        and result.timed_out is None
        and trio.current_time() < deadline
        and turn.resume_rejected(result)
    )
    ended_by_limit = False
    if result.timed_out is None:
        finished = turn.finish(result)
        ended_by_limit = turn.ended_by_limit(finished)
        if finished is not None:
            return _Tried(finished, turn, session_id, spawned=True, rejected=rejected,
                          ended_by_limit=ended_by_limit)
    outcome = failure_from_result(
        result, timeout_s=spec.timeout_s, idle_timeout_s=spec.idle_timeout_s,
        last_error=turn.last_error if result.timed_out is not None else None)
    return _Tried(outcome, turn, session_id, spawned=True, rejected=rejected,
                  timed_out=result.timed_out is not None,
                  ended_by_limit=result.timed_out is None and ended_by_limit)
