"""Agent CLIs prohost can drive, one module each, behind :class:`Brain`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from prohost.engine.agent.brains.base import Brain, McpError, McpWiring, Turn
from prohost.engine.agent.brains.plain import PlainBrain
from prohost.execline import program_name, speaks_acp
from prohost.options import BRAIN_CHOICES

__all__ = ["Brain", "McpError", "McpWiring", "Turn", "brain_for"]

#: ``[ACCOUNT=]VALUE`` flags as options keep them: (account or "", value).
PerAccount = Sequence[tuple[str, str]]


def brain_for(choice: str, exec_line: str, *, safe_tools: bool = False,
              max_cost_usd: float | None = None, acp_model: PerAccount = (),
              acp_mode: PerAccount = (), accounts: Sequence[tuple[str, Path]] = ()) -> Brain:
    """The brain for ``--brain`` (``auto``: from the program ``--exec`` runs).

    Raises :class:`BudgetRefused` for ``max_cost_usd`` with a brain that cannot
    bound what a run spends (§12: refused at start, naming the flag and the brain).
    ``acp_model``, ``acp_mode``: ``--acp-model``/``--acp-mode`` per account name
    ("": every account), ``accounts`` the ``--account`` folders (an ACP brain only).
    """
    brain = _brain_for(choice, exec_line, safe_tools=safe_tools)
    if acp_model or acp_mode:
        from prohost.engine.agent.brains.acp_brain import AcpBrain

        if not isinstance(brain, AcpBrain):
            raise BudgetRefused(
                f"--acp-model and --acp-mode are for agents spoken to over ACP, not the "
                f"{brain.name} brain: name the model on the --exec line instead "
                "(claude --model X, codex -m X)")
        brain.choose(dict(acp_model), dict(acp_mode), accounts)
    if max_cost_usd is not None:
        if not brain.bounds_cost:
            raise BudgetRefused(
                f"--max-cost cannot be used with the {brain.name} brain: "
                f"{brain.no_budget_because}; use it with --brain claude (Claude Code), "
                "or leave --max-cost out")
        brain.max_cost_usd = max_cost_usd
    return brain


class BudgetRefused(ValueError):
    """``--max-cost`` (or ``--acp-model``/``--acp-mode``) was given for a brain that
    cannot honour it."""


def _brain_for(choice: str, exec_line: str, *, safe_tools: bool) -> Brain:
    if choice == "auto":
        program = program_name(exec_line)
        if speaks_acp(exec_line):
            choice = "acp"
        else:
            choice = program if program in ("claude", "codex") else "plain"
    if choice == "acp":
        from prohost.engine.agent.brains.acp_brain import AcpBrain

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
