"""An agent's :class:`~prohost.engine.agent.launch.Output` for tests that watch
:func:`~prohost.engine.agent.process.run_agent` directly: each stdout line and each
read's time handed to a test's own function."""

from __future__ import annotations

from collections.abc import Callable


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
