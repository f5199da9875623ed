"""The words for how an agent's run ended when its CLI said nothing itself: a
timeout, a signal, an exit status (the outcome the server then hears, §7)."""

from __future__ import annotations

import signal

from prohost.engine.agent.brains.base import one_line
from prohost.engine.agent.process import ProcessResult
from prohost.engine.run.prompt import human_duration
from prohost.wire.runs import Outcome


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def limit_phrase(seconds: float) -> str:
    """ "45 minutes" as in "the 45-minute limit"."""
    number, _, unit = human_duration(seconds).partition(" ")
    return f"{number}-{unit.removesuffix('s')}"


def failure_from_result(result: ProcessResult, *, timeout_s: float,
                        idle_timeout_s: float, last_error: str | None = None) -> Outcome:
    """How the agent's process ended, in words, when its brain had nothing to say
    (a timeout, a signal, an exit status), given the run's ``--timeout`` and
    ``--idle-timeout``; a timeout also names the CLI's ``last_error``, if it
    reported one (Codex's "Reconnecting… waiting for network": it tells the sender
    why). ``duration_ms`` is set by the caller."""
    duration_ms = round(result.duration_s * 1000)
    said = f"; its last error: {one_line(last_error, 300)}" if last_error else ""
    if result.timed_out == "total":
        limit = limit_phrase(timeout_s)
        return Outcome.failure(
            f"the agent ran longer than the {limit} limit (--timeout){said}",
            duration_ms=duration_ms)
    if result.timed_out == "idle":
        idle = human_duration(idle_timeout_s)
        return Outcome.failure(
            f"the agent printed nothing for {idle} (--idle-timeout){said}",
            duration_ms=duration_ms)
    if result.signal is not None:
        error = f"the agent was killed by {signal_name(result.signal)}"
        if result.last_stderr_line:
            error += f": {result.last_stderr_line}"
        return Outcome.failure(error, duration_ms=duration_ms)
    if result.exit_code != 0:
        error = f"the agent exited with status {result.exit_code}"
        if result.last_stderr_line:
            error += f": {result.last_stderr_line}"
        return Outcome.failure(error, duration_ms=duration_ms)
    # Exit 0 and still no outcome: a brain that could not make sense of the output.
    return Outcome.failure("the agent exited without a reply the harness could read",
                           duration_ms=duration_ms)
