"""The fake ACP agent of tests/agents/fake_acp.py as the tests meet it: its
``--exec`` line and the environment that picks its scenario, keeps its sessions and
records what it is sent; and one attempt of the ACP brain against it through the
real spawn (:func:`talk`), for the brain's tests."""

from __future__ import annotations

import json
import math
import os
import shlex
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from prohost.engine.agent import poll
from prohost.engine.agent.brains.acp import AcpTurn
from prohost.engine.agent.brains.acp_brain import AcpBrain
from prohost.engine.agent.brains.base import McpWiring
from prohost.engine.agent.launch import Launch, ProcessLimits
from prohost.engine.agent.process import ProcessGroups, ProcessResult
from prohost.server import ServerHandle
from prohost.wire.runs import Outcome
from prohost.wire.timeline import ToolEvent
from prohost.wire.usage import Usage
from tests.kits.harness import Running, running_harness, running_server
from tests.kits.output import Heard, run_agent
from tests.kits.paths import AGENTS, logs_folder

#: tests/agents/fake_acp.py as an ``--exec`` line.
FAKE_ACP = f"{shlex.quote(sys.executable)} {shlex.quote(str(AGENTS / 'fake_acp.py'))}"


def acp_env(tmp_path: Path, scenario: str = "reply", **extra: str) -> dict[str, str]:
    """The environment that makes the fake agent play ``scenario``, keep its sessions
    and record every message (:func:`record_of`) in the test's logs folder, the one
    place outside a run's own that a confined agent may write (the harness kits open
    it with ``--allow-write``)."""
    logs = logs_folder(tmp_path)
    return {**os.environ, "FAKE_ACP_SCENARIO": scenario,
            "FAKE_ACP_STATE": str(logs / "sessions"),
            "FAKE_ACP_RECORD": str(record_of(tmp_path)), **extra}


def record_of(tmp_path: Path) -> Path:
    """Where the fake agent of :func:`acp_env` records every message it is sent."""
    return logs_folder(tmp_path) / "record.jsonl"


@asynccontextmanager
async def acp_harness(tmp_path: Path, scenario: str = "reply", *, home: Path | None = None,
                      **options: Any) -> AsyncIterator[tuple[ServerHandle, Running]]:
    """The reference server and a harness (its home ``tmp_path / "home"`` unless
    ``home``) whose agent is the fake ACP agent playing ``scenario``; ``options``:
    more harness options, or ``FAKE_ACP_*`` variables for the agent."""
    extra = {key: options.pop(key) for key in list(options) if key.startswith("FAKE_ACP_")}
    async with running_server() as server, running_harness(
        server, home if home is not None else tmp_path / "home", exec_command=FAKE_ACP,
        brain="acp", env=acp_env(tmp_path, scenario, **extra), **options,
    ) as running:
        yield server, running


#: The prompt the brain-level tests send.
PROMPT = "Please say hello.\n\nReply with exactly NO_REPLY to send nothing."


@pytest.fixture(autouse=True, params=["epoll", "tasks"])
def poller(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which way run_agent waits (both hold stdin open for a conversation)."""
    if request.param == "tasks":
        monkeypatch.setattr(poll, "USE_EPOLL", False)
    return str(request.param)


@attrs.define
class Talk:
    turn: AcpTurn
    result: ProcessResult | None = None
    events: list[ToolEvent] = attrs.Factory(list)
    outcome: Outcome | None = None
    record_path: Path | None = None
    #: Set once the first tool call is read.
    working: trio.Event = attrs.Factory(trio.Event)

    def record(self) -> list[dict[str, Any]]:
        assert self.record_path is not None
        lines = self.record_path.read_text().splitlines()
        return [json.loads(line) for line in lines]

    def methods(self) -> list[str]:
        return [m.get("method") or m.get("event") or "response" for m in self.record()]


def read(done: Talk, turn: AcpTurn, line: bytes) -> None:
    events = turn.feed(line)
    done.events.extend(events)
    if events:
        done.working.set()


async def talk(tmp_path: Path, scenario: str = "reply", *, session: str | None = None,
               before: Usage | None = None, safe_tools: bool = False,
               deadline: float = math.inf, groups: ProcessGroups | None = None,
               talk_to: Talk | None = None, mcp: McpWiring | None = None,
               **env: str) -> Talk:
    """One attempt of the ACP brain with the fake agent playing ``scenario``."""
    record_of(tmp_path).unlink(missing_ok=True)
    turn = AcpBrain(FAKE_ACP, safe_tools=safe_tools).new_turn()
    if before is not None:
        turn.usage_before = before
    done = talk_to if talk_to is not None else Talk(turn)
    done.turn, done.record_path = turn, record_of(tmp_path)
    agent_env = acp_env(tmp_path, scenario, **env)
    result = await run_agent(
        Launch(command=FAKE_ACP, stdin_text="never written", cwd=tmp_path, env=agent_env,
               conversation=turn.conversation(PROMPT, session, tmp_path, mcp, agent_env)),
        groups or ProcessGroups(), ProcessLimits(deadline=deadline, max_stdout_bytes=0),
        Heard(on_line=lambda line: read(done, turn, line)))
    done.result = result
    if result.timed_out is None:
        done.outcome = turn.finish(result)
    return done


async def cancel_when_working(tmp_path: Path, scenario: str, groups: ProcessGroups) -> Talk:
    """Start ``scenario`` and cancel the run once its tool call is seen."""
    done = Talk(AcpBrain(FAKE_ACP).new_turn())
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: talk(tmp_path, scenario, groups=groups, talk_to=done))
            await done.working.wait()
            scope.cancel()
    return done


