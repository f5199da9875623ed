"""The plain brain: any command; its trimmed stdout is the reply (§5.5)."""

from __future__ import annotations

from prohost.engine.agent.brains.base import Brain, McpWiring, Turn
from prohost.engine.agent.process import ProcessResult
from prohost.engine.agent.reply import final_reply
from prohost.wire.runs import Outcome


class PlainTurn(Turn):
    def finish(self, result: ProcessResult) -> Outcome | None:
        if result.exit_code != 0:
            return None
        text = result.stdout.decode("utf-8", errors="replace")
        return Outcome(ok=True, reply=final_reply(text, cut=result.stdout_truncated))


class PlainBrain(Brain):
    name = "plain"

    def command(self, *, session_id: str | None, mcp: McpWiring | None,
                max_cost_usd: float | None = None) -> str:
        return self.exec_line

    def new_turn(self) -> Turn:
        return PlainTurn()
