"""The plain brain end to end with real fake agents: every ending becomes an Outcome.

A run goes through the production Runner's middle (``tests/kits/runner.py``); what
``on_spawn`` does is one attempt's (:func:`execute`)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import signal
import sys
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import pytest
import trio

from prohost.engine.agent.brains.plain import PlainBrain
from prohost.engine.agent.environment import agent_env
from prohost.engine.agent.process import AgentWatch, ProcessGroups
from prohost.engine.agent.reply import MAX_REPLY_BYTES, REPLY_CUT_MARKER
from prohost.engine.run.execute import AgentSetup, Attempt, ExecSpec, execute
from prohost.engine.run.progress import Progress
from prohost.engine.run.prompt import PromptContext, build_prompt
from prohost.engine.run.staging import env_for, prompt_for
from prohost.wire.runs import AgentRun, Outcome
from tests.kits.paths import AGENTS, logs_folder
from tests.kits.runner import solo_runner

pytestmark = pytest.mark.protocol("§5")

RUN = AgentRun(run_id="run_exec_1", completion_path="/c", text="hello", author="dana")


def agent(name: str, *args: str | Path) -> str:
    return shlex.join([sys.executable, str(AGENTS / name), *map(str, args)])


def spec(
    command: str,
    workdir: Path,
    *,
    timeout_s: float = 0.0,
    idle_timeout_s: float = 0.0,
    parallel: bool = False,
    secrets: tuple[str, ...] = (),
) -> ExecSpec:
    return ExecSpec(
        command=command,
        workdir=workdir,
        timeout_s=timeout_s,
        idle_timeout_s=idle_timeout_s,
        parallel=parallel,
        secrets=secrets,
    )


async def execute_plain(
    run: AgentRun, exec_spec: ExecSpec, *, groups: ProcessGroups,
    on_spawn: Callable[[int], Awaitable[None]] | None = None,
    base_env: Mapping[str, str] | None = None,
) -> Outcome:
    """``run`` with the plain brain running ``exec_spec.command``: through the
    Runner's middle; with ``on_spawn``, one attempt alone (what it is handed)."""
    env = os.environ if base_env is None else base_env
    brain = PlainBrain(exec_spec.command)
    if on_spawn is not None:
        attempt = Attempt(run, prompt_for(run, exec_spec, None),
                          env_for(run, exec_spec, env, None), None, math.inf)
        async def spawned(agent: AgentWatch) -> None:
            await on_spawn(agent.pgid)  # the agent's process group, as the runner records it

        result = await execute(attempt, AgentSetup(brain, exec_spec, groups), Progress(),
                               spawned)
        return result.outcome
    with tempfile.TemporaryDirectory() as folder:
        async with solo_runner(Path(folder), exec_spec, brain, groups=groups, env=env) as solo:
            return await solo.outcome(run)


def base_env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def test_agent_env_marks_the_run_and_drops_secrets() -> None:
    base = {
        "PATH": "/bin",
        "KEEP": "kept",
        "AUTH": "Bearer tok-123",
        "HOOK": "x:sec-456:y",
        "CLAUDECODE": "1",
        "PROHOST_RUN_ID": "stale",
    }
    env = agent_env(base, "run_9", ["tok-123", "sec-456", ""])
    assert env == {
        "PATH": "/bin",
        "KEEP": "kept",
        "PROHOST_PAIRED_RUN": "1",
        "PROHOST_RUN_ID": "run_9",
    }
    assert base["CLAUDECODE"] == "1"  # the caller's mapping is untouched


async def test_reply_is_trimmed_stdout_and_prompt_is_stdin(
    tmp_path: Path, groups: ProcessGroups
) -> None:
    saved = tmp_path / "prompt.txt"
    exec_spec = spec(
        agent("reply.py", "--prompt-to", saved, "\n  Fixed: the fixture path.  \n"),
        tmp_path,
        timeout_s=600,
        idle_timeout_s=900,
        parallel=True,
    )
    with trio.fail_after(10):
        outcome = await execute_plain(RUN, exec_spec, groups=groups, base_env=base_env())
    assert outcome.ok
    assert outcome.reply == "Fixed: the fixture path."
    assert outcome.duration_ms is not None
    assert outcome.duration_ms >= 0
    expected = build_prompt(RUN, PromptContext(timeout_s=600, idle_timeout_s=900, parallel=True))
    assert saved.read_text(encoding="utf-8") == expected


async def test_no_reply_means_reply_none(tmp_path: Path, groups: ProcessGroups) -> None:
    with trio.fail_after(10):
        outcome = await execute_plain(
            RUN, spec(agent("reply.py", "NO_REPLY\n"), tmp_path), groups=groups
        )
    assert outcome.ok
    assert outcome.reply is None
    assert outcome.completion("r")["reply"] is None


async def test_nonzero_exit_reports_the_last_stderr_line(
    tmp_path: Path, groups: ProcessGroups
) -> None:
    command = agent(
        "reply.py", "--stderr", "loading", "--stderr", "fatal: no auth", "--exit", "2", ""
    )
    with trio.fail_after(10):
        outcome = await execute_plain(RUN, spec(command, tmp_path), groups=groups)
    assert not outcome.ok
    assert outcome.error == "the agent exited with status 2: fatal: no auth"
    assert outcome.retryable is False


async def test_nonzero_exit_without_stderr(tmp_path: Path, groups: ProcessGroups) -> None:
    with trio.fail_after(10):
        outcome = await execute_plain(RUN, spec("exit 7", tmp_path), groups=groups)
    assert outcome.error == "the agent exited with status 7"


async def test_killed_by_a_signal_says_which(tmp_path: Path, groups: ProcessGroups) -> None:
    with trio.fail_after(10):
        outcome = await execute_plain(RUN, spec("kill -KILL $$", tmp_path), groups=groups)
    assert outcome.error == "the agent was killed by SIGKILL"
    assert outcome.retryable is False


async def test_flood_reply_is_cut_with_a_marker(tmp_path: Path, groups: ProcessGroups) -> None:
    with trio.fail_after(15):
        outcome = await execute_plain(RUN, spec(agent("flood.py", "50"), tmp_path), groups=groups)
    assert outcome.ok
    assert outcome.reply is not None
    assert outcome.reply.startswith("rrrr")
    assert outcome.reply.endswith("\n\n" + REPLY_CUT_MARKER)
    assert len(outcome.reply.encode("utf-8")) <= MAX_REPLY_BYTES


async def test_env_has_run_markers_and_no_secrets(tmp_path: Path, groups: ProcessGroups) -> None:
    env = {
        **base_env(),
        "KEEP": "kept",
        "LEAKY": "Bearer tok-123",
        "CLAUDECODE": "1",
    }
    exec_spec = spec(agent("env_dump.py"), tmp_path, secrets=("tok-123", "sec-456"))
    with trio.fail_after(10):
        outcome = await execute_plain(RUN, exec_spec, groups=groups, base_env=env)
    assert outcome.reply is not None
    dumped = json.loads(outcome.reply)
    assert dumped["env"]["PROHOST_PAIRED_RUN"] == "1"
    assert dumped["env"]["PROHOST_RUN_ID"] == "run_exec_1"
    assert dumped["env"]["KEEP"] == "kept"
    assert "LEAKY" not in dumped["env"]
    assert "CLAUDECODE" not in dumped["env"]
    assert not any("tok-123" in value for value in dumped["env"].values())


async def test_workdir_is_created_and_used(tmp_path: Path, groups: ProcessGroups) -> None:
    workdir = tmp_path / "new" / "workspace"
    with trio.fail_after(10):
        outcome = await execute_plain(
            RUN, spec(agent("env_dump.py"), workdir), groups=groups, base_env=base_env()
        )
    assert outcome.reply is not None
    assert json.loads(outcome.reply)["cwd"] == str(workdir)


async def test_unusable_workdir_is_a_failure_not_an_exception(
    tmp_path: Path, groups: ProcessGroups
) -> None:
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("")
    with trio.fail_after(10):
        outcome = await execute_plain(RUN, spec("true", in_the_way), groups=groups)
    assert not outcome.ok
    assert outcome.error is not None
    assert outcome.error.startswith("could not create the working directory (--workdir): ")
    assert str(tmp_path) not in outcome.error  # §7: no local path goes to the server
    assert outcome.retryable is False


async def test_spawn_failure_is_a_failure_not_an_exception(
    tmp_path: Path, groups: ProcessGroups
) -> None:
    # An environment too big for exec(2) (E2BIG): the spawn itself fails, whoever
    # runs the test (a permissions trick would not stop root).
    huge_env = {**os.environ, "PROHOST_TEST_BALLAST": "x" * (4 * 1024 * 1024)}
    with trio.fail_after(10):
        outcome = await execute_plain(RUN, spec("true", tmp_path), groups=groups,
                                      base_env=huge_env)
    assert not outcome.ok
    assert outcome.error is not None
    assert outcome.error.startswith(
        "could not start the agent in the working directory (--workdir): ")
    assert str(tmp_path) not in outcome.error  # §7: no local path goes to the server
    assert len(groups) == 0


async def test_total_timeout_message(tmp_path: Path, groups: ProcessGroups) -> None:
    pidfile = tmp_path / "grandchild.pid"
    command = agent("stubborn.py", pidfile, "--then", "print")
    try:
        with trio.fail_after(10):
            outcome = await execute_plain(
                RUN, spec(command, tmp_path, timeout_s=0.5, idle_timeout_s=30), groups=groups
            )
    finally:
        _kill(pidfile)
    assert outcome.error == "the agent ran longer than the 0.5-second limit (--timeout)"
    assert outcome.retryable is False


async def test_idle_timeout_message(tmp_path: Path, groups: ProcessGroups) -> None:
    pidfile = tmp_path / "grandchild.pid"
    try:
        with trio.fail_after(10):
            outcome = await execute_plain(
                RUN,
                spec(agent("stubborn.py", pidfile), tmp_path, idle_timeout_s=0.5),
                groups=groups,
            )
    finally:
        _kill(pidfile)
    assert outcome.error == "the agent printed nothing for 0.5 seconds (--idle-timeout)"
    assert outcome.retryable is False


@pytest.mark.protocol("§6")
async def test_cancellation_propagates_after_the_group_is_gone(
    tmp_path: Path, groups: ProcessGroups
) -> None:
    spawned: list[int] = []

    async def on_spawn(pgid: int) -> None:
        spawned.append(pgid)
        raise_cancel.cancel()

    with trio.fail_after(10):
        with trio.CancelScope() as raise_cancel:
            # exec: the group is the leader alone, so once it is reaped the
            # group is provably empty.
            await execute_plain(
                RUN, spec("exec sleep 600", tmp_path), groups=groups, on_spawn=on_spawn
            )
            pytest.fail("execute_plain returned instead of propagating the cancellation")
    assert raise_cancel.cancelled_caught
    assert len(groups) == 0
    # The leader was reaped inside: its group has no member left to signal.
    with pytest.raises(ProcessLookupError):
        os.killpg(spawned[0], 0)


def _kill(pidfile: Path) -> None:
    """Teardown for a grandchild that a broken harness might have left behind."""
    if pidfile.exists():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


async def test_an_on_spawn_failure_is_the_callers_not_the_agents(
    tmp_path: Path, groups: ProcessGroups
) -> None:
    async def on_spawn(pgid: int) -> None:
        raise OSError(28, "No space left on device")

    with trio.fail_after(10), pytest.raises(OSError, match="No space left"):
        await execute_plain(RUN, spec("exec sleep 600", tmp_path), groups=groups, on_spawn=on_spawn)
    assert len(groups) == 0


@pytest.mark.protocol("§3")
@pytest.mark.parametrize("run_id", ["..", "."])
async def test_a_wire_run_id_never_names_a_folder(tmp_path: Path, run_id: str) -> None:
    """Reproduction 1 of issue 8 at the runner: a run id of ``..`` (or ``.``) with an
    ``mcp`` field, past intake, must not make its scratch folder ``$PROHOST_HOME``
    (or ``runs/``), which the run's cleanup removes."""
    from prohost.engine.agent.environment import scratch_folder
    from prohost.engine.ledger import RunState
    from prohost.engine.run.heldrun import HeldRun
    from prohost.wire.runs import Mcp
    from tests.kits.harness import running_harness, running_server

    home = tmp_path / "home"
    record = logs_folder(tmp_path) / "record.json"
    env = {**os.environ, "FAKE_CLAUDE_SCENARIO": "reply", "FAKE_CLAUDE_RECORD": str(record)}
    fake_claude = agent("fake_claude.py")
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, home, exec_command=fake_claude, brain="claude", env=env,
        ) as running:
            other = scratch_folder(home / "runs", "run_other")
            other.mkdir(parents=True)
            (other / "mcp.json").write_text("{}\n")
            # status.json is rewritten (through a temp file) as it likes; all else stays.
            before = {path for path in home.rglob("*")
                      if path.is_file() and "status.json" not in path.name}
            assert running.ledger is not None and len(before) >= 3  # credentials, ledger, other
            run = AgentRun(run_id=run_id, completion_path="/v1/agent/runs/dots/complete",
                           text="hi", mcp=Mcp(url="https://chat.example/mcp", token="tok-9"))
            running.ledger.admit(run_id, run.lane, "{}", 0.0)
            assert running.harness.runner is not None
            await running.harness.runner.run(HeldRun.of(run))
            row = running.ledger.get(run_id)
            assert row is not None and row.state is RunState.REPORTED
            assert json.loads(row.outcome or "{}")["ok"] is True
            # The agent got its config from a folder of its own under runs/ ...
            [entry] = json.loads(record.read_text())
            config = Path(entry["argv"][entry["argv"].index("--mcp-config") + 1])
            own = scratch_folder(home / "runs", run_id)
            assert config == own / "mcp.json"
            assert own.parent == home / "runs" and own.name not in (".", "..")
            # ... which is gone, and nothing else is.
            assert not own.exists()
            after = {path for path in home.rglob("*") if path.is_file()}
            assert before <= after
            assert (other / "mcp.json").read_text() == "{}\n"


@pytest.mark.protocol("§5")
async def test_a_vanished_private_checkout_is_a_failure_that_says_so(
    tmp_path: Path, groups: ProcessGroups
) -> None:
    # The attempt starts in the conversation's worktree (§5.3), which is gone by
    # the spawn: the failure names it, and --workdir is not made in its stead.
    workdir = tmp_path / "workspace"
    exec_spec = spec("pwd", workdir)
    attempt = Attempt(RUN, "hi", env_for(RUN, exec_spec, base_env(), None), None, math.inf,
                      cwd=tmp_path / "worktrees" / "conv-C1" / "app")
    with trio.fail_after(10):
        result = await execute(attempt, AgentSetup(PlainBrain("pwd"), exec_spec, groups),
                               Progress(), noop_spawn)
    assert result.outcome.error == (
        "could not start the agent in its private checkout of the first --repos entry: "
        "No such file or directory")
    assert not workdir.exists()


@pytest.mark.protocol("§5")
async def test_the_attempt_runs_in_its_cwd_not_the_workdir(
    tmp_path: Path, groups: ProcessGroups
) -> None:
    private = tmp_path / "worktrees" / "conv-C1" / "app"
    private.mkdir(parents=True)
    exec_spec = spec("pwd", tmp_path / "workspace")
    attempt = Attempt(RUN, "hi", env_for(RUN, exec_spec, base_env(), None), None, math.inf,
                      cwd=private)
    with trio.fail_after(10):
        result = await execute(attempt, AgentSetup(PlainBrain("pwd"), exec_spec, groups),
                               Progress(), noop_spawn)
    assert result.outcome.reply is not None
    assert await trio.Path(result.outcome.reply).resolve() == await trio.Path(private).resolve()


async def noop_spawn(agent: AgentWatch) -> None:
    """An ``on_spawn`` with nothing to record."""
