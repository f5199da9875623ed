"""Agent CLIs prohost can drive, one module each, behind :class:`Brain`."""

from __future__ import annotations

from prohost.engine.agent.brains.base import Brain, McpError, McpWiring, ToolEvent, Turn
from prohost.engine.agent.brains.cmdline import program_name
from prohost.engine.agent.brains.plain import PlainBrain

__all__ = ["BRAIN_NAMES", "Brain", "McpError", "McpWiring", "ToolEvent", "Turn", "brain_for"]

BRAIN_NAMES = ("auto", "claude", "codex", "plain")


def brain_for(choice: str, exec_line: str, *, safe_tools: bool = False) -> Brain:
    """The brain for ``--brain`` (``auto``: from the program ``--exec`` runs)."""
    if choice == "auto":
        program = program_name(exec_line)
        choice = program if program in ("claude", "codex") else "plain"
    if choice == "claude":
        from prohost.engine.agent.brains.claude import ClaudeBrain

        return ClaudeBrain(exec_line, safe_tools=safe_tools)
    if choice == "codex":
        from prohost.engine.agent.brains.codex import CodexBrain

        return CodexBrain(exec_line, safe_tools=safe_tools)
    if choice == "plain":
        return PlainBrain(exec_line, safe_tools=safe_tools)
    raise ValueError(f"unknown brain {choice!r}; choose one of {', '.join(BRAIN_NAMES)}")
