"""Agent CLIs prohost can drive, one module each, behind :class:`Brain`."""

from __future__ import annotations

from prohost.engine.agent.brains.base import Brain, McpError, McpWiring, Turn
from prohost.engine.agent.brains.plain import PlainBrain
from prohost.execline import program_name, speaks_acp
from prohost.options import BRAIN_CHOICES

__all__ = ["Brain", "McpError", "McpWiring", "Turn", "brain_for"]


def brain_for(choice: str, exec_line: str, *, safe_tools: bool = False,
              max_cost_usd: float | None = None) -> Brain:
    """The brain for ``--brain`` (``auto``: from the program ``--exec`` runs).

    Raises :class:`BudgetRefused` for ``max_cost_usd`` with a brain that cannot
    bound what a run spends (§12: refused at start, naming the flag and the brain).
    """
    brain = _brain_for(choice, exec_line, safe_tools=safe_tools)
    if max_cost_usd is not None:
        if not brain.bounds_cost:
            raise BudgetRefused(
                f"--max-cost cannot be used with the {brain.name} brain: "
                f"{brain.no_budget_because}; use it with --brain claude (Claude Code), "
                "or leave --max-cost out")
        brain.max_cost_usd = max_cost_usd
    return brain


class BudgetRefused(ValueError):
    """``--max-cost`` was given for a brain that cannot honour it."""


def _brain_for(choice: str, exec_line: str, *, safe_tools: bool) -> Brain:
    if choice == "auto":
        program = program_name(exec_line)
        if speaks_acp(exec_line):
            choice = "acp"
        else:
            choice = program if program in ("claude", "codex") else "plain"
    if choice == "acp":
        from prohost.engine.agent.brains.acp import AcpBrain

        return AcpBrain(exec_line, safe_tools=safe_tools)
    if choice == "claude":
        from prohost.engine.agent.brains.claude import ClaudeBrain

        return ClaudeBrain(exec_line, safe_tools=safe_tools)
    if choice == "codex":
        from prohost.engine.agent.brains.codex import CodexBrain

        return CodexBrain(exec_line, safe_tools=safe_tools)
    if choice == "plain":
        return PlainBrain(exec_line, safe_tools=safe_tools)
    raise ValueError(f"unknown brain {choice!r}; choose one of {', '.join(BRAIN_CHOICES)}")
