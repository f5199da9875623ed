"""What one attempt's agent printed reaches the run without a call back into it:
the agent room's reader writes the session, the model and the last output's time
into the run's Progress and hands its tool calls to the timeline, and the run's
step between the spawn and the watch is handed the agent's watch, whose
``leader_exited`` turns true only once the agent has exited (what a cancel reads, §6)."""

from __future__ import annotations

import math
from pathlib import Path

import trio

from prohost.engine.agent.brains.claude import ClaudeBrain
from prohost.engine.agent.process import AgentWatch, ProcessGroups
from prohost.engine.run.execute import AgentSetup, Attempt, ExecSpec, execute
from prohost.engine.run.progress import Progress
from prohost.wire.runs import AgentRun
from prohost.wire.timeline import ToolEvent
from tests.kits.fake_clis import FAKE_CLAUDE, claude_env

#: The model the fake Claude announces (tests/agents/fake_claude.py `MODEL`).
MODEL = "claude-sonnet-4-5-20250929"


class Timeline:
    def __init__(self) -> None:
        self.events: list[ToolEvent] = []

    def add(self, events: list[ToolEvent]) -> None:
        self.events.extend(events)


async def test_the_agent_s_output_reaches_progress_and_timeline(
    tmp_path: Path, groups: ProcessGroups,
) -> None:
    watches: list[tuple[AgentWatch, bool, int | None]] = []
    spawned_at: list[float] = []

    async def on_spawn(agent: AgentWatch) -> None:
        spawned_at.append(trio.current_time())  # before any of its output is read
        watches.append((agent, agent.leader_exited, progress.attempts))

    progress, timeline = Progress(), Timeline()
    spec = ExecSpec(command=FAKE_CLAUDE, workdir=tmp_path, timeout_s=0.0, idle_timeout_s=0.0,
                    parallel=False, secrets=())
    run = AgentRun(run_id="run_output_1", completion_path="/c", text="hello", author="dana")
    attempt = Attempt(run, "hello", claude_env(tmp_path, "tool"), None, math.inf)
    with trio.fail_after(30):
        result = await execute(attempt, AgentSetup(ClaudeBrain(FAKE_CLAUDE), spec, groups),
                               progress, on_spawn, timeline)
    assert result.outcome.ok, result.outcome
    assert result.session_id is not None and progress.session_id == result.session_id
    assert progress.model == MODEL
    # Each read's time, from the reader: the last one after the spawn's step.
    assert progress.last_output is not None and progress.last_output > spawned_at[0]
    assert timeline.events and {event.name for event in timeline.events} == {"Bash"}
    [(agent, exited_at_spawn, attempts)] = watches
    assert (exited_at_spawn, attempts) == (False, 1)
    assert agent.leader_exited  # the agent finished by itself
