"""What :func:`prohost.engine.agent.process.start_agent` is asked, in three named parts:
what to run (:class:`Launch`), when to stop it (:class:`ProcessLimits`), and where
what it prints goes (:class:`Output`). The first two are frozen: a caller builds them
once per spawn, and the watch never changes them. Here too is what a brain that talks with
its agent while it runs implements (:class:`Conversation`, through the
:class:`StdinPipe` it is given), since :class:`Launch` carries it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import attrs

if TYPE_CHECKING:
    from prohost.engine.sandbox import Confinement

#: Longest stdout line handed to ``Output.line``. A streaming brain's single
#: JSON event can legitimately be several MiB (a large tool result), so this is
#: generous; a longer line is dropped and counted rather than buffered.
DEFAULT_MAX_LINE_BYTES = 8 * 1024 * 1024

#: The stdout kept by default (the reply of a brain that does not stream).
DEFAULT_MAX_STDOUT_BYTES = 1024 * 1024


#: Time an agent that has said all it had to (its conversation closed stdin) gets
#: to exit by itself before its group is stopped; the run is not a timeout then.
LINGER_S = 5.0


class StdinPipe(Protocol):
    """The agent's stdin as a :class:`Conversation` writes it."""

    def write(self, data: bytes) -> None:
        """Queue ``data``; it is written as the agent reads (never blocks, never
        raises: once stdin is closed, or the agent closed it, it is dropped)."""

    def close(self, linger_s: float = LINGER_S, eof: bool = True) -> None:
        """End-of-file once everything queued is written: the conversation is over, and
        the agent has ``linger_s`` to exit before its group is stopped (again: sooner).
        ``eof=False``: no end-of-file, only a bound (replaced by the next; inf: none)."""


class Conversation(Protocol):
    """A brain that talks with its agent over stdin while it runs (the ACP brain)
    instead of writing one prompt and end-of-file. It reads through
    ``Output.line`` and writes through the :class:`StdinPipe` it is given, all
    from the task watching the agent, so it must be quick and must not raise."""

    def open(self, stdin: StdinPipe) -> None:
        """The process exists: start talking (its output is read from now on)."""

    def interrupt(self) -> bool:
        """The group is about to be stopped (a limit passed, or the run was
        cancelled): ask the agent to wind down (ACP ``session/cancel``, then
        end-of-file once it has answered). ``True``: it was asked, so the stop
        first waits, briefly, for the agent to exit by itself."""


@attrs.frozen(kw_only=True)
class Launch:
    """What to run: ``command`` through ``/bin/sh -c`` in ``cwd`` with exactly
    ``env``, given ``stdin_text`` (UTF-8) and then end-of-file — or, with a
    ``conversation``, talked with over stdin instead (``stdin_text`` is then not
    written). With a ``confinement`` (docs/protocol.md §13) it starts confined; the
    caller closes that (it may spawn again with it)."""

    command: str
    stdin_text: str
    cwd: Path
    env: Mapping[str, str]
    conversation: Conversation | None = None
    confinement: Confinement | None = None


@attrs.frozen(kw_only=True)
class ProcessLimits:
    """When the agent is stopped, and what of its output is kept: ``deadline`` (on
    trio's clock), ``idle_timeout_s`` without output on either stream (0: no idle
    limit), the first ``max_stdout_bytes`` of stdout (0: none kept), and stdout
    lines up to ``max_line_bytes`` handed on (longer ones skipped and counted)."""

    deadline: float = math.inf
    idle_timeout_s: float = 0.0
    max_stdout_bytes: int = DEFAULT_MAX_STDOUT_BYTES
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES


#: No time limit, the default stdout kept.
DEFAULT_LIMITS = ProcessLimits()


class Output(Protocol):
    """Where the watch puts what the agent prints as it comes, from the task
    watching it, so it must be quick and must not raise: each stdout line without
    its ``\\n`` (when ``reads_lines``; lines over ``max_line_bytes`` are skipped and
    counted) and the trio time of every read from either stream (what the idle
    timer counts from). It is state the caller reads, not a call back into it
    (:class:`prohost.engine.agent.reading.OutputReader` is the harness's)."""

    #: Stdout is cut into lines for :meth:`line` (a streaming brain).
    reads_lines: bool

    def line(self, raw: bytes) -> None:
        """One stdout line, without its ``\\n``."""

    def heard(self, at: float) -> None:
        """Either stream printed something at ``at`` (trio time)."""
