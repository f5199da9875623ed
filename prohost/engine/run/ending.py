"""How an agent's run ended when its CLI said nothing itself: a timeout, a signal,
an exit status, as the outcome the server then hears (§7; the sentences are
:mod:`prohost.wire.outcomes`)."""

from __future__ import annotations

import signal

from prohost.engine.agent.brains.base import one_line
from prohost.engine.agent.process import ProcessResult
from prohost.wire.outcomes import (
    NO_READABLE_REPLY,
    exited_with,
    killed_by,
    printed_nothing,
    ran_too_long,
)
from prohost.wire.runs import Outcome


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


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
        return Outcome.failure(ran_too_long(timeout_s) + said, duration_ms=duration_ms)
    if result.timed_out == "idle":
        return Outcome.failure(printed_nothing(idle_timeout_s) + said, duration_ms=duration_ms)
    if result.signal is not None:
        return Outcome.failure(killed_by(signal_name(result.signal), result.last_stderr_line),
                               duration_ms=duration_ms)
    if result.exit_code != 0:
        return Outcome.failure(exited_with(result.exit_code, result.last_stderr_line),
                               duration_ms=duration_ms)
    # Exit 0 and still no outcome: a brain that could not make sense of the output.
    return Outcome.failure(NO_READABLE_REPLY, duration_ms=duration_ms)
