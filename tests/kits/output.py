"""For tests that spawn and watch an agent directly
(:func:`~prohost.engine.agent.process.start_agent`): :func:`run_agent`, both steps at
once, and :class:`Heard`, an :class:`~prohost.engine.agent.launch.Output` handing
each stdout line and each read's time to a test's own function."""

from __future__ import annotations

from collections.abc import Callable

from prohost.engine.agent.launch import DEFAULT_LIMITS, Launch, Output, ProcessLimits
from prohost.engine.agent.process import ProcessGroups, ProcessResult, start_agent


async def run_agent(launch: Launch, groups: ProcessGroups,
                    limits: ProcessLimits = DEFAULT_LIMITS,
                    output: Output | None = None) -> ProcessResult:
    """Spawn the agent and watch it end, with nothing between the two steps."""
    async with start_agent(launch, groups, limits, output) as agent:
        return await agent.finish()


class Heard:
    """``on_line`` gets each stdout line (``None``: stdout is not cut into lines),
    ``on_output`` the trio time of every read from either stream."""

    def __init__(self, on_line: Callable[[bytes], None] | None = None,
                 on_output: Callable[[float], None] | None = None) -> None:
        self._on_line = on_line
        self._on_output = on_output
        self.reads_lines = on_line is not None

    def line(self, raw: bytes) -> None:
        if self._on_line is not None:
            self._on_line(raw)

    def heard(self, at: float) -> None:
        if self._on_output is not None:
            self._on_output(at)
