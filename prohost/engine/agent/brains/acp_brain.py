"""The ACP brain: an agent spoken to over the Agent Client Protocol, as the harness
configures it for every run (the command line run as written, the model and mode
each account's sessions get, the run's MCP server over HTTP, the agent's own folders,
and the one mend its saved sessions need); one conversation with it is
:class:`~prohost.engine.agent.brains.acp.AcpTurn`'s."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from prohost.engine.accounts.book import ACCOUNT_DIR_VARIABLE
from prohost.engine.agent.brains.acp import AcpTurn
from prohost.engine.agent.brains.acp_gemini import gemini_folder, keep_loadable
from prohost.engine.agent.brains.base import MCP_SERVER_NAME, Brain, McpWiring, check_mcp
from prohost.execline import acp_agent
from prohost.wire.runs import Mcp


class AcpBrain(Brain):
    """An agent spoken to over ACP; ``--exec`` is the command that starts it in ACP
    mode (``gemini --acp``, ``opencode acp``…), run as written."""

    name = "acp"
    streams = True
    running_totals = True
    no_budget_because = "ACP has no way to tell an agent what it may spend"

    def command(self, *, session_id: str | None, mcp: McpWiring | None,
                max_cost_usd: float | None = None) -> str:
        # Everything else (the session, the prompt) goes over the protocol.
        return self.exec_line

    def __init__(self, exec_line: str, *, safe_tools: bool = False,
                 max_cost_usd: float | None = None) -> None:
        super().__init__(exec_line, safe_tools=safe_tools, max_cost_usd=max_cost_usd)
        #: --acp-model, --acp-mode by account name ("": every account).
        self.models: dict[str, str] = {}
        self.modes: dict[str, str] = {}
        #: --account folders → names, to know an attempt's account by its env.
        self._accounts: dict[str, str] = {}

    @property
    def folders_owner(self) -> str:
        """The agent the command line starts (its folders, §13), ``acp`` when unknown."""
        return acp_agent(self.exec_line) or "acp"

    def choose(self, models: Mapping[str, str], modes: Mapping[str, str],
               accounts: Sequence[tuple[str, Path]] = ()) -> None:
        """Give each session ``models`` and ``modes`` (by account; "": every one)."""
        self.models, self.modes = dict(models), dict(modes)
        self._accounts = {str(folder): name for name, folder in accounts}

    def new_turn(self) -> AcpTurn:
        return AcpTurn(safe_tools=self.safe_tools, choose=self._choice)

    def _choice(self, env: Mapping[str, str]) -> tuple[str | None, str | None]:
        """The model and mode for an attempt whose agent gets ``env`` (its account's)."""
        account = self._accounts.get(env.get(ACCOUNT_DIR_VARIABLE, ""), "default")
        return (self.models.get(account, self.models.get("")),
                self.modes.get(account, self.modes.get("")))

    def configured_model(self) -> str | None:
        return self.models.get("") or super().configured_model()

    def wire_mcp(self, mcp: Mcp, folder: Path,
                 env: Mapping[str, str] | None = None) -> McpWiring:
        """The run's MCP server as an ACP HTTP ``McpServer`` for ``session/new``
        (its token in an ``Authorization`` header): it reaches the agent on its
        stdin, never on a command line or in a file. Nothing is written."""
        check_mcp(mcp, transport="ACP agents are given MCP servers over HTTP")
        headers = [{"name": "Authorization", "value": f"Bearer {mcp.token}"}] if mcp.token else []
        return McpWiring(servers=({"type": "http", "name": MCP_SERVER_NAME, "url": mcp.url,
                                   "headers": headers},))

    def before_spawn(self, session_id: str | None, env: Mapping[str, str],
                     kept_at: Callable[[Path], Path]) -> None:
        """Gemini CLI's session file, renamed where its bugs cannot erase it before
        the turn loads it (:mod:`~prohost.engine.agent.brains.acp_gemini`)."""
        if session_id is None or acp_agent(self.exec_line) != "gemini":
            return
        folder = gemini_folder(env)
        if folder is not None:
            keep_loadable(kept_at(folder), session_id)

    def version_command(self) -> str | None:
        # Not ``<program> --version``: the ACP adapters (claude-agent-acp,
        # codex-acp) take no such flag and start serving ACP instead; an agent's
        # version comes in its initialize answer (agentInfo), not asked apart.
        return None
