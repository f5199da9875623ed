"""run_agent with real subprocesses: output, bounds, timeouts, group kills, cancellation.

On Linux run_agent waits on the agent's pipes and its leader's exit through one
epoll instance (prohost/engine/agent/poll.py); elsewhere, or without pidfd, through
a task per descriptor. Every behaviour must be the same with either, so every test
here runs twice: ``[epoll]`` with the poller this machine would use, ``[tasks]``
with epoll turned off.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import shlex
import signal
import sys
import tracemalloc
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from prohost.engine.agent import poll
from prohost.engine.agent.launch import Launch, ProcessLimits
from prohost.engine.agent.process import ProcessGroups, ProcessResult, start_agent
from tests.kits.output import Heard, run_agent
from tests.kits.paths import AGENTS

pytestmark = pytest.mark.protocol("§5")

MIB = 1024 * 1024


def agent(name: str, *args: str | Path) -> str:
    """The shell command line that runs a fake agent from tests/agents."""
    words = [sys.executable, str(AGENTS / name), *map(str, args)]
    return shlex.join(words)


def env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


async def run_here(
    command: str, tmp_path: Path, groups: ProcessGroups, **options: Any
) -> ProcessResult:
    """run_agent in ``tmp_path`` with these ``groups``; unless ``options`` say otherwise,
    with an empty prompt and nothing but PATH in its environment. Each option goes to
    the part of the call that has a field of its name."""
    options.setdefault("stdin_text", "")
    options.setdefault("env", env())
    on_spawn = options.pop("on_spawn", None)
    output = Heard(options.pop("on_stdout_line", None), options.pop("on_output", None))
    parts: dict[type, dict[str, Any]] = {Launch: {}, ProcessLimits: {}}
    for name, value in options.items():
        (kind,) = [kind for kind in parts if name in attrs.fields_dict(kind)]
        parts[kind][name] = value
    async with start_agent(Launch(command=command, cwd=tmp_path, **parts[Launch]), groups,
                           ProcessLimits(**parts[ProcessLimits]), output) as agent:
        if on_spawn is not None:  # the caller's step between the spawn and the watch
            await on_spawn(agent.pgid)
        return await agent.finish()


@pytest.fixture(autouse=True, params=["epoll", "tasks"])
def poller(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which way run_agent waits: as it would here, or a task per descriptor."""
    if request.param == "tasks":
        monkeypatch.setattr(poll, "USE_EPOLL", False)
    return str(request.param)


@pytest.fixture
def pidfile(tmp_path: Path) -> Iterator[Path]:
    """Where stubborn.py writes its grandchild's pid; the grandchild dies at teardown."""
    path = tmp_path / "grandchild.pid"
    yield path
    if path.exists():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(path.read_text()), signal.SIGKILL)


def grandchild(pidfile: Path) -> int:
    return int(pidfile.read_text())


def _exited(pid: int) -> int | None:
    """A pidfd that becomes readable when ``pid`` has exited, or None if it is gone."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None


async def assert_gone(pidfile: Path) -> None:
    """The grandchild in ``pidfile`` has exited (or is exiting: it was SIGKILLed).

    Waits on a pidfd rather than polling: the kernel closes a killed process's
    pipes a moment before it marks it exited, and run_agent returns on the former.
    A grandchild nobody killed never exits, and the test's fail_after catches it.
    """
    fd = _exited(grandchild(pidfile))
    if fd is None:
        return
    try:
        await trio.lowlevel.wait_readable(fd)
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    fd = _exited(pid)
    if fd is None:
        return False
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return not poller.poll(0)
    finally:
        os.close(fd)


async def test_reply_on_stdout_and_prompt_on_stdin(tmp_path: Path, groups: ProcessGroups) -> None:
    with trio.fail_after(10):
        saved = tmp_path / "prompt.txt"
        result = await run_here(
            agent("reply.py", "--prompt-to", saved, "  hello there\n"),
            tmp_path,
            groups,
            stdin_text="the prompt ✓",
        )
    assert result.exit_code == 0
    assert result.signal is None
    assert result.timed_out is None
    assert result.stdout == b"  hello there\n"
    assert not result.stdout_truncated
    assert saved.read_text(encoding="utf-8") == "the prompt ✓"
    assert result.duration_s >= 0
    assert len(groups) == 0


async def test_nonzero_exit_keeps_the_last_stderr_line(
    tmp_path: Path, groups: ProcessGroups
) -> None:
    with trio.fail_after(10):
        result = await run_here(
            agent(
                "reply.py",
                "--stderr",
                "warming up",
                "--stderr",
                "boom: bad config",
                "--stderr",
                "   ",
                "--exit",
                "3",
                "",
            ),
            tmp_path,
            groups,
        )
    assert result.exit_code == 3
    assert result.signal is None
    assert result.last_stderr_line == "boom: bad config"


async def test_long_stderr_line_is_bounded(tmp_path: Path, groups: ProcessGroups) -> None:
    with trio.fail_after(10):
        result = await run_here("printf 'x%.0s' $(seq 1 3000) >&2; exit 1", tmp_path, groups)
    assert result.exit_code == 1
    assert result.last_stderr_line == "x" * 500


async def test_killed_by_a_signal(tmp_path: Path, groups: ProcessGroups) -> None:
    with trio.fail_after(10):
        result = await run_here("kill -KILL $$", tmp_path, groups)
    assert result.exit_code is None
    assert result.signal == signal.SIGKILL
    assert result.timed_out is None


async def test_an_agent_that_never_reads_stdin_gets_through(
    tmp_path: Path, groups: ProcessGroups
) -> None:
    # Both ways are far more than a pipe buffer holds: a harness that finished
    # writing the prompt before reading would wait on an agent waiting on it.
    with trio.fail_after(10):
        result = await run_here(
            agent("reply.py", "--no-read", "--times", str(MIB), "d"),
            tmp_path,
            groups,
            stdin_text="p" * (4 * MIB),
        )
    assert result.exit_code == 0
    assert result.stdout == b"d" * MIB


class Puppeteer:
    """The test's end of tests/agents/puppet.py, and what run_agent heard from it."""

    def __init__(self) -> None:
        self.port = 0
        self.heard: list[float] = []  # on_output: the trio time of every read
        self.result: ProcessResult | None = None  # once run_agent has returned
        self._conn: trio.SocketStream | None = None
        self._changed = trio.Event()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listener.socket.getsockname()[1]
        task_status.started()
        async with listener:
            self._conn = await listener.accept()
        self._poke()

    def on_output(self, at: float) -> None:
        self.heard.append(at)
        self._poke()

    def _poke(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def run(self, tmp_path: Path, groups: ProcessGroups, idle_timeout_s: float) -> None:
        self.result = await run_here(
            agent("puppet.py", self.port), tmp_path, groups,
            idle_timeout_s=idle_timeout_s, on_output=self.on_output,
        )
        self._poke()

    async def _wait(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            await self._changed.wait()

    async def say(self, word: str, text: str) -> None:
        """Have the puppet write ``text`` on stdout (``out``) or stderr (``err``),
        and return once run_agent has read it. Fails if the puppet was stopped."""
        await self._wait(lambda: self._conn is not None)
        assert self._conn is not None
        assert self.result is None, f"the agent was stopped before `{word}`: {self.result}"
        before = len(self.heard)
        await self._conn.send_all(f"{word} {text}\n".encode())
        await self._wait(lambda: len(self.heard) > before or self.result is not None)
        assert self.result is None, f"`{word}` was never heard; the agent ended: {self.result}"

    async def exit(self, code: int) -> None:
        assert self._conn is not None
        # A puppet already stopped for being idle can no longer hear this.
        with contextlib.suppress(trio.BrokenResourceError):
            await self._conn.send_all(f"exit {code}\n".encode())


@contextlib.asynccontextmanager
async def puppet_agent(tmp_path: Path, groups: ProcessGroups,
                       mock_clock: trio.testing.MockClock) -> AsyncIterator[Puppeteer]:
    """A puppet agent under a 10 s idle limit, on trio's still clock, for the block
    (which ends when the puppet does). Should something hang, the clock jumps after
    30 idle real seconds (no other timer runs here) and fail_after ends the test."""
    mock_clock.autojump_threshold = 30
    puppet = Puppeteer()
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            await nursery.start(puppet.serve)
            nursery.start_soon(puppet.run, tmp_path, groups, 10)
            yield puppet


async def test_output_on_either_stream_resets_the_idle_timer(
    tmp_path: Path, groups: ProcessGroups, mock_clock: trio.testing.MockClock
) -> None:
    # trio's clock stands still unless the test moves it, and the puppet prints only
    # when told: 6 s of silence, stderr, 6 s, stdout, 6 s, exit. Under the 10 s
    # idle limit only if output on stderr and on stdout each reset the timer.
    async with puppet_agent(tmp_path, groups, mock_clock) as puppet:
        mock_clock.jump(6)
        await puppet.say("err", "e")
        mock_clock.jump(6)  # 12 s since the start, 6 s since stderr spoke
        # Were the idle timer deaf to stderr, the agent would be stopped by now,
        # before it could hear the next line.
        await trio.testing.wait_all_tasks_blocked()
        await puppet.say("out", "o")
        mock_clock.jump(6)
        await trio.testing.wait_all_tasks_blocked()
        await puppet.exit(0)
    ended = puppet.result
    assert ended is not None
    assert ended.timed_out is None
    assert ended.exit_code == 0
    assert ended.stdout == b"o\n"
    assert ended.last_stderr_line == "e"


async def test_flood_keeps_memory_bounded(tmp_path: Path, groups: ProcessGroups) -> None:
    lines: list[int] = []
    tracemalloc.start()
    try:
        with trio.fail_after(15):
            result = await run_here(
                agent("flood.py", "50"),
                tmp_path,
                groups,
                max_stdout_bytes=MIB,
                on_stdout_line=lambda line: lines.append(len(line)),
            )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.exit_code == 0
    assert result.stdout == b"r" * MIB
    assert result.stdout_truncated
    assert result.last_stderr_line == "flood done"
    # stdout was one 50 MiB line: over the line bound, so skipped, not buffered.
    assert lines == []
    assert result.overlong_lines == 1
    # 100 MiB went through; keeping it would need at least 50 MiB.
    print(f"peak traced memory {peak / MIB:.1f} MiB")
    assert peak < 24 * MIB, f"peak {peak / MIB:.1f} MiB"


async def test_stdout_lines_are_split_and_bounded(tmp_path: Path, groups: ProcessGroups) -> None:
    seen: list[bytes] = []
    with trio.fail_after(10):
        result = await run_here(
            agent("lines.py"),
            tmp_path,
            groups,
            max_stdout_bytes=16,
            on_stdout_line=seen.append,
        )
    assert result.exit_code == 0
    assert [line[:6] for line in seen] == [b"first", b"second", b"zzzzzz"]
    assert len(seen[2]) == 5 * MIB  # a 5 MiB line gets through whole
    assert result.overlong_lines == 1  # the 9 MiB one did not
    assert result.stdout == b"first\n" + b"y" * 10
    assert result.stdout_truncated


async def test_runs_in_cwd_with_exactly_env(tmp_path: Path, groups: ProcessGroups) -> None:
    os.environ["PROHOST_TEST_LEAK"] = "must not be inherited"
    try:
        with trio.fail_after(10):
            result = await run_here(
                agent("env_dump.py"),
                tmp_path,
                groups,
                env={**env(), "ONLY_THIS": "yes"},
            )
    finally:
        del os.environ["PROHOST_TEST_LEAK"]
    dumped = json.loads(result.stdout)
    assert dumped["cwd"] == str(tmp_path)
    assert dumped["env"]["ONLY_THIS"] == "yes"
    assert "PROHOST_TEST_LEAK" not in dumped["env"]


async def test_missing_cwd_raises_oserror(tmp_path: Path, groups: ProcessGroups) -> None:
    with trio.fail_after(10), pytest.raises(OSError):
        await run_agent(Launch(command="true", stdin_text="", cwd=tmp_path / "nope", env=env()),
                        groups)
    assert len(groups) == 0


async def test_group_is_registered_while_it_lives(tmp_path: Path, groups: ProcessGroups) -> None:
    spawned: list[int] = []

    async def on_spawn(pgid: int) -> None:
        assert pgid in groups
        assert os.getpgid(pgid) == pgid  # leader of its own group
        assert os.getsid(pgid) == pgid  # and of its own session
        spawned.append(pgid)

    with trio.fail_after(10):
        await run_here("true", tmp_path, groups, on_spawn=on_spawn)
    assert len(spawned) == 1
    assert len(groups) == 0


async def test_normal_exit_sweeps_the_group(
    tmp_path: Path, groups: ProcessGroups, pidfile: Path
) -> None:
    with trio.fail_after(10):
        result = await run_here(agent("stubborn.py", pidfile, "--then", "exit"), tmp_path, groups)
        assert result.exit_code == 0
        assert result.stdout == b"ready\n"
        await assert_gone(pidfile)


async def _stopped_by_a_timer(
    tmp_path: Path,
    groups: ProcessGroups,
    pidfile: Path,
    clock: trio.testing.MockClock,
    *,
    deadline: float = math.inf,
    idle_timeout_s: float = 0.0,
) -> ProcessResult:
    """stubborn.py on a still trio clock: 11 s pass once it is ready, then the grace.

    Nothing is timed by the wall clock, so a slow start cannot eat the budget: the
    clock moves 11 s only once the agent printed ``ready``, and past the grace only
    once the leader has gone (at the SIGTERM a timer sent), so it is the stubborn
    grandchild that the SIGKILL is for. Should a timer never fire, the clock jumps
    after 30 idle real seconds, to the next deadline there is.
    """
    clock.autojump_threshold = 30
    ready = trio.Event()
    leader: list[int] = []  # a pidfd of the group's leader
    result: list[ProcessResult] = []

    def on_line(line: bytes) -> None:
        if line == b"ready":
            ready.set()

    async def on_spawn(pgid: int) -> None:
        leader.append(os.pidfd_open(pgid))

    async def run_it() -> None:
        result.append(await run_here(
            agent("stubborn.py", pidfile), tmp_path, groups, deadline=deadline,
            idle_timeout_s=idle_timeout_s, on_spawn=on_spawn, on_stdout_line=on_line,
        ))

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_it)
            await ready.wait()
            clock.jump(11)
            await trio.lowlevel.wait_readable(leader[0])
            clock.jump(groups.grace_s)
    finally:
        for fd in leader:
            os.close(fd)
    return result[0]


async def test_idle_timeout_kills_the_group(
    tmp_path: Path, groups: ProcessGroups, pidfile: Path, mock_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(600):
        result = await _stopped_by_a_timer(
            tmp_path, groups, pidfile, mock_clock, idle_timeout_s=10
        )
        assert result.timed_out == "idle"
        assert result.signal == signal.SIGTERM  # the leader went at the first signal
        assert result.stdout == b"ready\n"
        await assert_gone(pidfile)
    assert len(groups) == 0


async def test_total_timeout_kills_the_group(
    tmp_path: Path, groups: ProcessGroups, pidfile: Path, mock_clock: trio.testing.MockClock
) -> None:
    # The idle limit is far past the 11 s the clock moves: only the total deadline
    # can stop it.
    with trio.fail_after(600):
        result = await _stopped_by_a_timer(
            tmp_path, groups, pidfile, mock_clock,
            deadline=trio.current_time() + 10, idle_timeout_s=30,
        )
        assert result.timed_out == "total"
        assert result.signal == signal.SIGTERM
        assert result.stdout == b"ready\n"
        await assert_gone(pidfile)


@pytest.mark.protocol("§6")
async def test_cancel_kills_the_group_and_reraises(
    tmp_path: Path, groups: ProcessGroups, pidfile: Path
) -> None:
    ready = trio.Event()

    def on_line(line: bytes) -> None:
        if line == b"ready":
            ready.set()

    async def cancel_when_ready(scope: trio.CancelScope) -> None:
        await ready.wait()
        assert _alive(grandchild(pidfile))
        scope.cancel()

    with trio.fail_after(10):
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancel_when_ready, scope)
                try:
                    await _run_until_cancelled(tmp_path, groups, pidfile, on_line)
                except trio.Cancelled:
                    assert len(groups) == 0
                    raise
                pytest.fail("run_agent returned instead of re-raising the cancellation")
        assert scope.cancelled_caught
        await assert_gone(pidfile)


async def _run_until_cancelled(
    tmp_path: Path, groups: ProcessGroups, pidfile: Path, on_line: Callable[[bytes], None]
) -> None:
    await run_here(agent("stubborn.py", pidfile), tmp_path, groups, on_stdout_line=on_line)


@pytest.mark.protocol("§9")
async def test_kill_all_reaches_a_running_group(
    tmp_path: Path, groups: ProcessGroups, pidfile: Path
) -> None:
    def on_line(line: bytes) -> None:
        if line == b"ready":
            groups.kill_all(signal.SIGKILL)

    with trio.fail_after(10):
        result = await run_here(
            agent("stubborn.py", pidfile),
            tmp_path,
            groups,
            on_stdout_line=on_line,
        )
        assert result.signal == signal.SIGKILL
        assert result.timed_out is None
        await assert_gone(pidfile)
    groups.kill_all(signal.SIGKILL)  # nothing left: must not raise


async def test_idle_limit_counts_from_the_last_output(
    tmp_path: Path, groups: ProcessGroups, mock_clock: trio.testing.MockClock
) -> None:
    # Under a 10 s idle limit, counting from the first line: a line at 6 s, one at
    # 12 s (past 10 s since the first, not since the last), then silence: stopped
    # at 22 s, for being idle.
    async with puppet_agent(tmp_path, groups, mock_clock) as puppet:
        await puppet.say("out", "first")
        mock_clock.jump(6)
        await puppet.say("out", "second")
        mock_clock.jump(6)
        await trio.testing.wait_all_tasks_blocked()
        await puppet.say("out", "third")
        mock_clock.jump(11)
        await trio.testing.wait_all_tasks_blocked()
        await puppet.exit(0)  # too late: it was stopped at 22 s
    ended = puppet.result
    assert ended is not None
    assert ended.timed_out == "idle"
    assert ended.signal == signal.SIGTERM
    assert ended.stdout == b"first\nsecond\nthird\n"
    assert len(groups) == 0


async def test_a_prompt_larger_than_the_pipe_is_fed_as_the_output_is_read(
    tmp_path: Path, groups: ProcessGroups
) -> None:
    # cat prints the prompt back as it reads it: 4 MiB each way, far more than the
    # pipes hold, so writing all of the prompt before reading anything would hang.
    prompt = "".join(f"line {n}\n" for n in range(500_000))
    with trio.fail_after(20):
        result = await run_here("cat", tmp_path, groups, stdin_text=prompt,
                                max_stdout_bytes=8 * MIB)
    assert result.exit_code == 0
    assert result.stdout == prompt.encode()
    assert not result.stdout_truncated


@pytest.mark.protocol("§7")
async def test_a_limit_that_passed_during_on_spawn_stops_the_agent(
    tmp_path: Path, groups: ProcessGroups, mock_clock: trio.testing.MockClock
) -> None:
    # on_spawn (the harness's durable write of the group) takes 11 s of a 10 s run:
    # the agent, which would sleep for ten minutes, is stopped once it returns.
    mock_clock.autojump_threshold = 30

    async def slow_on_spawn(pgid: int) -> None:
        mock_clock.jump(11)
        await trio.lowlevel.checkpoint()

    with trio.fail_after(600):
        result = await run_here("exec sleep 600", tmp_path, groups,
                                deadline=trio.current_time() + 10, on_spawn=slow_on_spawn)
    assert result.timed_out == "total"
    assert result.signal == signal.SIGTERM
    assert len(groups) == 0


@pytest.mark.protocol("§7")
async def test_a_failing_callback_stops_the_group_and_is_raised_as_is(
    tmp_path: Path, groups: ProcessGroups, pidfile: Path
) -> None:
    def on_line(line: bytes) -> None:
        if line == b"ready":
            raise ValueError("the brain could not parse this")

    with trio.fail_after(10):
        with pytest.raises(ValueError, match="could not parse"):
            await run_here(agent("stubborn.py", pidfile), tmp_path, groups,
                           on_stdout_line=on_line)
        assert len(groups) == 0
        await assert_gone(pidfile)


async def test_a_process_that_left_the_group_delays_the_return_only_a_little(
    tmp_path: Path, groups: ProcessGroups, pidfile: Path, mock_clock: trio.testing.MockClock
) -> None:
    # The escaped child keeps both pipes open for ten minutes and no signal to the
    # group reaches it: run_agent gives up waiting for end-of-file after 2 s.
    mock_clock.autojump_threshold = 30
    leader: list[int] = []
    spawned = trio.Event()
    result: list[ProcessResult] = []

    async def on_spawn(pgid: int) -> None:
        leader.append(os.pidfd_open(pgid))
        spawned.set()

    async def run_it() -> None:
        result.append(await run_here(agent("escaper.py", pidfile), tmp_path, groups,
                                     on_spawn=on_spawn))

    try:
        with trio.fail_after(600):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run_it)
                await spawned.wait()
                await trio.lowlevel.wait_readable(leader[0])
                await trio.testing.wait_all_tasks_blocked()
                assert not result, "run_agent returned while a process held its pipes"
                mock_clock.jump(2)
    finally:
        for fd in leader:
            os.close(fd)
    assert result[0].exit_code == 0
    assert result[0].stdout == b"escaped\n"
    assert _alive(grandchild(pidfile))  # not in the group: not run_agent's to kill
    assert len(groups) == 0
