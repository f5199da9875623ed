"""The agents' working folder is made once per harness, and made again if it vanishes.

Real fake agents in real folders; the harness's file steps are counted by a
:class:`Bounds` that records what each one was for.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
import trio

from prohost.engine.agent.brains.plain import PlainBrain
from prohost.engine.agent.process import ProcessGroups
from prohost.engine.blocking import Bounds
from prohost.engine.run.execute import ExecSpec
from prohost.wire.runs import AgentRun, Outcome
from tests.kits.paths import AGENTS
from tests.kits.runner import solo_runner

pytestmark = pytest.mark.protocol("§5")

T = TypeVar("T")


class CountingBounds(Bounds):
    """The harness's bounds, noting what each file step was for."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[str] = []

    async def file_step(self, fn: Callable[..., T], *args: object, what: str,
                        **kwargs: object) -> T:
        self.steps.append(what)
        return await super().file_step(fn, *args, what=what, **kwargs)  # type: ignore[arg-type]


def env_dump_spec(workdir: Path) -> ExecSpec:
    command = shlex.join([sys.executable, str(AGENTS / "env_dump.py")])
    return ExecSpec(command=command, workdir=workdir, timeout_s=0, idle_timeout_s=0,
                    parallel=False, secrets=())


async def run_through_runner(run: AgentRun, spec: ExecSpec, bounds: Bounds,
                             groups: ProcessGroups) -> Outcome:
    """``run`` through the production Runner's middle, with the harness's ``bounds``."""
    with tempfile.TemporaryDirectory() as folder:
        async with solo_runner(Path(folder), spec, PlainBrain(spec.command), groups=groups,
                               bounds=bounds, env={"PATH": os.environ["PATH"]}) as solo:
            return await solo.outcome(run)


async def run_once(spec: ExecSpec, bounds: Bounds, groups: ProcessGroups, n: int) -> str:
    """One run; the folder the agent ran in."""
    run = AgentRun(run_id=f"run_wf_{n}", completion_path="/c", text="hi")
    with trio.fail_after(30):
        outcome = await run_through_runner(run, spec, bounds, groups)
    assert outcome.ok, outcome.error
    assert outcome.reply is not None
    cwd: str = json.loads(outcome.reply)["cwd"]
    return cwd


def made(bounds: CountingBounds) -> int:
    return sum(what.startswith("creating the working directory") for what in bounds.steps)


async def test_the_working_folder_is_made_once_for_many_runs(
    tmp_path: Path, groups: ProcessGroups
) -> None:
    workdir = tmp_path / "new" / "workspace"
    spec, bounds = env_dump_spec(workdir), CountingBounds()
    for n in range(3):
        assert await run_once(spec, bounds, groups, n) == str(workdir)
    assert made(bounds) == 1, bounds.steps


async def test_a_working_folder_removed_between_runs_is_made_again(
    tmp_path: Path, groups: ProcessGroups
) -> None:
    """Someone cleans up the workspace while the harness is idle: the next run still
    runs there (the folder is made again), and so do the ones after it."""
    workdir = tmp_path / "workspace"
    spec, bounds = env_dump_spec(workdir), CountingBounds()
    await run_once(spec, bounds, groups, 0)
    shutil.rmtree(workdir)
    assert await run_once(spec, bounds, groups, 1) == str(workdir)
    assert workdir.is_dir()
    assert await run_once(spec, bounds, groups, 2) == str(workdir)
    assert made(bounds) == 2, bounds.steps


async def test_a_working_folder_replaced_by_a_file_fails_the_run_clearly(
    tmp_path: Path, groups: ProcessGroups, caplog: pytest.LogCaptureFixture
) -> None:
    """Removed and replaced by a file: the run fails (not the harness) with a line
    naming the flag (the server never hears a local path, §7; the log names the
    folder), and the run after the file is gone runs again."""
    workdir = tmp_path / "workspace"
    spec, bounds = env_dump_spec(workdir), CountingBounds()
    await run_once(spec, bounds, groups, 0)
    shutil.rmtree(workdir)
    workdir.write_text("in the way")
    run = AgentRun(run_id="run_wf_x", completion_path="/c", text="hi")
    with trio.fail_after(30):
        outcome = await run_through_runner(run, spec, bounds, groups)
    assert not outcome.ok
    assert outcome.error is not None
    assert outcome.error.startswith("could not "), outcome.error
    assert "(--workdir)" in outcome.error and str(tmp_path) not in outcome.error
    assert str(workdir) in caplog.text
    workdir.unlink()
    assert await run_once(spec, bounds, groups, 2) == str(workdir)
