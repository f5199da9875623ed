"""One run executed with the plain brain: prompt → environment → spawn → reply → Outcome.

The plain brain is any command that reads the prompt on stdin and prints its
reply on stdout (``claude -p`` without stream-json, a shell script, ``cat``). It
knows nothing of sessions or tool calls, so everything it needs to say about how
the run went is in the exit status and the last line it wrote to stderr.

Every way a run can end becomes an :class:`Outcome`, never an exception, except
cancellation: that belongs to the caller, which reports it (§6).
"""

from __future__ import annotations

import math
import os
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

import attrs
import trio

from prohost.agentproc import ProcessGroups, ProcessResult, run_agent
from prohost.prompt import (
    MAX_REPLY_BYTES,
    PromptContext,
    build_prompt,
    cap_reply,
    human_duration,
    reply_from_text,
)
from prohost.runs import AgentRun, Outcome

#: Set to ``1`` for every agent the harness starts, so instructions the agent reads
#: from disk can tell a paired run (someone is waiting in a thread) from any other.
PAIRED_RUN_ENV = "PROHOST_PAIRED_RUN"
RUN_ID_ENV = "PROHOST_RUN_ID"

#: Claude Code sets this in its own shells. A harness started from one would
#: pass it on, and the agent would then believe it was nested inside Claude Code.
_NESTED_CLAUDE_ENV = "CLAUDECODE"


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


def agent_env(base: Mapping[str, str], run_id: str, secrets: Sequence[str]) -> dict[str, str]:
    """The environment an agent runs with: ``base`` plus the run's markers, minus secrets.

    A variable is dropped when its value contains a secret anywhere, not only when
    it equals one: ``Authorization: Bearer <token>`` in some variable leaks as much.
    """
    needles = [secret for secret in secrets if secret]
    env = {
        name: value
        for name, value in base.items()
        if name != _NESTED_CLAUDE_ENV and not any(needle in value for needle in needles)
    }
    env[PAIRED_RUN_ENV] = "1"
    env[RUN_ID_ENV] = run_id
    return env


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _limit_phrase(seconds: float) -> str:
    """ "45 minutes" as in "the 45-minute limit"."""
    number, _, unit = human_duration(seconds).partition(" ")
    return f"{number}-{unit.removesuffix('s')}"


def outcome_from_result(result: ProcessResult, spec: ExecSpec) -> Outcome:
    """What a plain agent's ending means for the run (also used by tests and the runner)."""
    duration_ms = round(result.duration_s * 1000)
    if result.timed_out == "total":
        limit = _limit_phrase(spec.timeout_s)
        return Outcome.failure(
            f"the agent ran longer than the {limit} limit (--timeout)", duration_ms=duration_ms
        )
    if result.timed_out == "idle":
        idle = human_duration(spec.idle_timeout_s)
        return Outcome.failure(
            f"the agent printed nothing for {idle} (--idle-timeout)", duration_ms=duration_ms
        )
    if result.signal is not None:
        error = f"the agent was killed by {_signal_name(result.signal)}"
        if result.last_stderr_line:
            error += f": {result.last_stderr_line}"
        return Outcome.failure(error, duration_ms=duration_ms)
    if result.exit_code != 0:
        error = f"the agent exited with status {result.exit_code}"
        if result.last_stderr_line:
            error += f": {result.last_stderr_line}"
        return Outcome.failure(error, duration_ms=duration_ms)
    reply = reply_from_text(result.stdout.decode("utf-8", errors="replace"))
    if reply is not None:
        reply = cap_reply(reply, cut=result.stdout_truncated)
    return Outcome(ok=True, reply=reply, duration_ms=duration_ms)


async def execute_plain(
    run: AgentRun,
    spec: ExecSpec,
    *,
    groups: ProcessGroups,
    on_spawn: Callable[[int], Awaitable[None]] | None = None,
    base_env: Mapping[str, str] | None = None,
) -> Outcome:
    """Run ``run`` with the plain brain and say how it went.

    ``base_env`` defaults to this process's environment. ``spec.workdir`` is created
    when missing. Failures (cannot start, non-zero exit, signal, timeouts) come back
    as ``Outcome.failure(..., retryable=False)``, never as exceptions.

    Cancelled: the agent's process group is stopped (SIGTERM, then SIGKILL after
    ``groups.grace_s``, shielded and bounded) before the ``trio.Cancelled`` leaves
    this function; no outcome is produced, since the caller reports the cancel.
    """
    # The budget starts now, not at spawn: preparing the run is part of it.
    started = trio.current_time()
    deadline = started + spec.timeout_s if spec.timeout_s > 0 else math.inf
    prompt = build_prompt(
        run,
        PromptContext(
            timeout_s=spec.timeout_s,
            idle_timeout_s=spec.idle_timeout_s,
            parallel=spec.parallel,
        ),
    )
    env = agent_env(os.environ if base_env is None else base_env, run.run_id, spec.secrets)
    try:
        await trio.Path(spec.workdir).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return Outcome.failure(
            f"could not create the working directory {spec.workdir}: {exc.strerror or exc}"
        )
    spawned = False

    async def spawned_as(pgid: int) -> None:
        nonlocal spawned
        spawned = True
        if on_spawn is not None:
            await on_spawn(pgid)

    try:
        result = await run_agent(
            spec.command,
            stdin_text=prompt,
            cwd=spec.workdir,
            env=env,
            groups=groups,
            deadline=deadline,
            idle_timeout_s=spec.idle_timeout_s,
            max_stdout_bytes=MAX_REPLY_BYTES,
            on_spawn=spawned_as,
        )
    except OSError as exc:
        if spawned:
            raise  # from on_spawn: the caller's own failure, not the agent's
        # The spawn itself failed: /bin/sh missing, the directory vanished between
        # mkdir and spawn, the process table full.
        return Outcome.failure(
            f"could not start the agent in {spec.workdir}: {exc.strerror or exc}",
            duration_ms=round((trio.current_time() - started) * 1000),
        )
    return outcome_from_result(result, spec)
