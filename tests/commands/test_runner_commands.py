"""``prohost agent stop``, ``agent logs`` and ``agent runs`` (issue 31, point 6), each
run as a real ``python -m prohost`` process beside a real harness process on a home
paired with the reference server (port 0), its real ledger and log file.

Nothing sleeps: the tests wait on the server's state, the Gate's agents, the
harness's log lines and the commands' own output lines.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pty
import signal
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import trio

from prohost.commands.runner import _signals_to_send, logs_command
from prohost.engine.agent.stderrtail import write_tail
from prohost.engine.view.snapshot import write_snapshot
from prohost.invocation import command
from prohost.logfile import log_path
from tests.kits.harness import finished, start_run
from tests.kits.lockholder import signalled, start_holder, stop_holder
from tests.kits.panel import base
from tests.kits.process import gated_process, wait_gone
from tests.kits.program import cli_env, prohost
from tests.kits.serverproc import quoted_commands, run_printed, without_prohost_on_path
from tests.kits.status import status_says


class Lines:
    """A command started in the background, its stdout read line by line."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._changed = trio.Event()

    async def read(self) -> None:
        assert self.proc.stdout is not None
        pending = b""
        while chunk := await self.proc.stdout.receive_some():
            *done, pending = (pending + chunk).split(b"\n")
            self.lines.extend(line.decode() for line in done)
            self._changed.set()
            self._changed = trio.Event()

    async def wait_line(self, *texts: str) -> str:
        """The first line holding every one of ``texts``, once there is one."""
        while not any(all(text in line for text in texts) for line in self.lines):
            await self._changed.wait()
        return next(line for line in self.lines if all(text in line for text in texts))


async def start(nursery: trio.Nursery, home: Path, *args: str) -> Lines:
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "prohost", *args], env=cli_env(home),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines = Lines(proc)
    nursery.start_soon(lines.read)
    return lines


async def test_stop_drains_the_harness_and_waits_until_it_has_exited(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with gated_process(home) as (gate, server, harness), \
                trio.open_nursery() as nursery:
            busy = await start_run(server, gate, "work", conversation_id="C1")
            stop = await start(nursery, home, "agent", "stop")
            line = await stop.wait_line("draining pid")
            assert f"pid {harness.proc.pid}" in line
            await harness.wait_log("draining: finishing 1 running run(s)")
            # From another shell Ctrl-C cannot reach the harness: status names the
            # command that can (issue 31, point 9). The column is how long the agent
            # has been quiet, not a countdown.
            status = (await prohost(home, "agent", "status")).stdout.decode()
            joined = " ".join(line.strip() for line in status.splitlines())
            assert f"; `{command('agent', 'stop', '--now')}` stops them" in joined, status
            assert "Ctrl-C" not in status
            header = next(line for line in status.splitlines() if "conversation" in line)
            assert header.split()[-1] == "quiet" and "idle" not in header
            # It drains: the run in progress goes on, and `stop` waits for it.
            assert stop.proc.returncode is None and harness.proc.returncode is None
            await gate.release(busy, "finished")
            assert await stop.proc.wait() == 0
            assert await harness.wait_clean_exit() == 0
            assert server.run(busy).reply == "finished"
            assert f"prohost agent pid {harness.proc.pid} has exited." in stop.lines
            assert any("drained: every run has finished" in entry for entry in harness.log)

        # No harness any more: exit 1, said on stderr.
        none = await prohost(home, "agent", "stop")
        assert none.returncode == 1
        assert b"No prohost agent is running" in none.stderr


async def test_stop_now_stops_the_running_agents(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with gated_process(home) as (gate, server, harness):
            busy = await start_run(server, gate, "work", conversation_id="C1")
            stopped = await prohost(home, "agent", "stop", "--now")
            assert stopped.returncode == 0, stopped.stderr
            assert b"stopping the running agents" in stopped.stdout
            assert await harness.wait_clean_exit() == 130
            assert await wait_gone(gate.pids[busy])
            await server.wait_until(finished(busy))
            assert server.run(busy).completion is not None
            assert server.run(busy).completion["retryable"] is True
    # A stop is not called a drain in the log (issue 31, point 9).
    assert not any("drained: every run has finished" in entry for entry in harness.log)
    assert any("stopped: every run that was running was stopped" in entry
               for entry in harness.log)


async def test_now_after_a_drain_is_the_second_signal_not_a_third(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with gated_process(home) as (gate, server, harness), \
                trio.open_nursery() as nursery:
            await start_run(server, gate, "work", conversation_id="C1")
            drain = await start(nursery, home, "agent", "stop")
            # Said once the harness's status says it drains.
            await drain.wait_line("draining pid")
            stopped = await prohost(home, "agent", "stop", "--now")
            assert stopped.returncode == 0, stopped.stderr
            assert await harness.wait_clean_exit() == 130
            assert await drain.proc.wait() == 0
    assert any("again: stopping the running agents" in entry for entry in harness.log)
    assert not any("a third time" in entry for entry in harness.log)


@pytest.mark.parametrize("kind", ["gc", "unrecorded"])
async def test_stop_signals_only_a_harness_whose_pid_it_knows(tmp_path: Path, kind: str) -> None:
    # `agent gc` holds the home while it removes worktrees: a TERM would stop it half
    # way. A harness whose pid could not be written (a full disk) is running all the
    # same: "none is running" would be false.
    home = tmp_path / "home"
    holder = start_holder(home, kind)  # type: ignore[arg-type]
    try:
        stopped = await prohost(home, "agent", "stop")
        assert not signalled(holder)
    finally:
        stop_holder(holder)
    assert stopped.returncode == 1
    said = stopped.stderr.decode()
    assert "No prohost agent is running" not in said
    if kind == "gc":
        assert f"`{command('agent', 'gc')}` (pid {holder.pid}) holds {home}, not an" in said
    else:
        assert "did not record its pid" in said and f"lsof {home / 'agent.lock'}" in said


async def test_status_during_a_drain_names_a_stop_that_runs_as_printed(
    tmp_path: Path
) -> None:
    # From another shell, `agent status` of a draining harness names the command
    # that stops its runs; for a person without prohost on PATH (a virtual
    # environment not activated) it must run as printed, and stop them.
    home = tmp_path / "home"
    env = without_prohost_on_path(cli_env(home))
    with trio.fail_after(60):
        async with gated_process(home) as (gate, server, harness):
            busy = await start_run(server, gate, "work", conversation_id="C1")
            harness.send_signal(signal.SIGINT)  # the first: it drains
            await status_says(home, lambda snapshot: snapshot.connection == "draining")
            status = await trio.run_process(
                [sys.executable, "-m", "prohost", "agent", "status"], env=env,
                capture_stdout=True, capture_stderr=True, check=False)
            said = " ".join(line.strip() for line in status.stdout.decode().splitlines())
            note = said.split("taking no new ones; ", 1)[1]
            [stop] = quoted_commands(note.split(" stops them", 1)[0])
            stopped = await run_printed(stop, env)
            assert stopped.returncode == 0, stopped.stderr
            assert await harness.wait_clean_exit() == 130
            await server.wait_until(finished(busy))
    completion = server.run(busy).completion
    assert completion is not None and completion["error"] == "the agent was stopped"


@pytest.mark.parametrize(("connection", "now", "signals"), [
    ("connected", False, 1), ("connected", True, 2),
    # --now after a drain is the second signal; a third would kill at once (§9).
    ("draining", False, 0), ("draining", True, 1),
    ("stopping", False, 0), ("stopping", True, 0),
])
def test_stop_sends_what_makes_the_count_right(
    tmp_path: Path, connection: str, now: bool, signals: int
) -> None:
    write_snapshot(tmp_path, attrs.evolve(base(), connection=connection))
    assert _signals_to_send(tmp_path, now) == signals


async def test_a_foreground_run_logs_to_the_file_agent_logs_prints(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with gated_process(home) as (gate, server, _harness), \
                trio.open_nursery() as nursery:
            follow = await start(nursery, home, "agent", "logs", "-f")
            # The harness's start, already in the file (it runs in the foreground).
            await follow.wait_line("connected to")
            busy = await start_run(server, gate, "work", conversation_id="C1")
            await gate.release(busy, "done")
            # A line written after `logs -f` started reaches it too.
            await follow.wait_line(f"run {busy}", "finished")
            follow.proc.terminate()
            await follow.proc.wait()
            printed = await prohost(home, "agent", "logs")
            assert printed.returncode == 0
            assert f"run {busy} (C1) finished" in printed.stdout.decode()
            assert printed.stdout.decode() == log_path(home).read_text()
            last = await prohost(home, "agent", "logs", "-n", "1")
            assert last.stdout.decode() == log_path(home).read_text().splitlines(True)[-1]
    assert (await prohost(tmp_path / "elsewhere", "agent", "logs")).returncode == 1


async def test_runs_lists_the_ledger_newest_first(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with gated_process(home) as (gate, server, _harness):
            first = await start_run(server, gate, "one", conversation_id="C1")
            await gate.release(first, "first reply")
            await server.wait_until(finished(first))
            second = await start_run(server, gate, "two", conversation_id="C2")
            await gate.fail(second, 3)
            await server.wait_until(finished(second))
            # Read-only beside the running harness.
            listed = await prohost(home, "agent", "runs", "--json")
            assert listed.returncode == 0, listed.stderr
            runs = json.loads(listed.stdout)
            assert [run["run_id"] for run in runs] == [second, first]
            newest, oldest = runs
            assert oldest["conversation_id"] == "C1" and oldest["ok"] is True
            assert oldest["error"] is None and oldest["duration_ms"] >= 0
            assert newest["ok"] is False and "status 3" in newest["error"]
            for run in runs:
                assert set(run) >= {"run_id", "conversation_id", "state", "ok", "error",
                                    "accepted_at", "finished_at", "duration_ms", "account",
                                    "cost_usd", "checkouts"}
                assert run["accepted_at"] <= run["finished_at"]
            limited = json.loads((await prohost(home, "agent", "runs", "--json",
                                                "--limit", "1")).stdout)
            assert [run["run_id"] for run in limited] == [second]
            text = (await prohost(home, "agent", "runs")).stdout.decode().splitlines()
            assert len(text) == 2 and second in text[0] and text[0].startswith("✗")
            assert first in text[1] and text[1].startswith("✓") and "C1" in text[1]
            shown = await prohost(home, "agent", "runs", "--show", second)
            assert shown.returncode == 0 and "status 3" in shown.stdout.decode()
            # The harness kept the failed agent's stderr with the run.
            assert "stderr    (its end, 64 KiB at most):\nthe gate told me to fail\n" \
                in shown.stdout.decode()
            # A longer tail (written where the runner keeps it) is shown by its end.
            write_tail(home, second, b"x" * 100_000 + b"\nTraceback: the real cause\n")
            shown = await prohost(home, "agent", "runs", "--show", second, "--json")
            document = json.loads(shown.stdout)
            assert document["run_id"] == second
            assert document["stderr"].endswith("Traceback: the real cause\n")
            assert len(document["stderr"]) == 64 * 1024
            missing = await prohost(home, "agent", "runs", "--show", "run_nope")
            assert missing.returncode == 1


def test_logs_follow_goes_on_across_a_rotation(tmp_path: Path) -> None:
    """`agent logs -f` reads what is appended, finishes the rotated file, then goes on
    with the new one from its start. The steps happen between its looks (the
    ``keep_following`` hook), so nothing waits."""
    path = log_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text("one\n")
    out = io.StringIO()
    looks = 0

    def keep_following() -> bool:
        nonlocal looks
        looks += 1
        if looks == 1:
            with path.open("a") as log:
                log.write("two\n")
        elif looks == 2:
            rotated = path.with_name(path.name + ".1")
            path.rename(rotated)
            with rotated.open("a") as log:
                log.write("three\n")  # written just before the handler switched files
            path.write_text("four\n")
        # Bounded, so that a follower that misses the rotation fails, not hangs.
        return "four" not in out.getvalue() and looks < 10

    assert logs_command(tmp_path, follow=True, out=out, keep_following=keep_following) == 0
    assert out.getvalue() == "one\ntwo\nthree\nfour\n"


async def test_with_the_live_panel_the_log_file_still_says_what_ran(tmp_path: Path) -> None:
    """In a terminal the panel shows each run, so its progress lines stay off the
    screen; the log file still gets them, as the service's does."""
    home = tmp_path / "home"
    leader, follower = pty.openpty()
    with trio.fail_after(60):
        try:
            async with gated_process(home, output=follower) as (gate, server, harness), \
                    trio.open_nursery() as nursery:
                os.close(follower)
                follower = -1
                screen = trio.lowlevel.FdStream(leader)
                leader = -1
                shown = bytearray()

                async def read_screen() -> None:
                    with contextlib.suppress(trio.BrokenResourceError, OSError):
                        while chunk := await screen.receive_some():
                            shown.extend(chunk)

                nursery.start_soon(read_screen)
                busy = await start_run(server, gate, "work", conversation_id="C1")
                await gate.release(busy, "done")
                await server.wait_until(finished(busy))
                assert (await prohost(home, "agent", "stop")).returncode == 0
                assert await harness.proc.wait() == 0
                nursery.cancel_scope.cancel()
        finally:
            for fd in (leader, follower):
                if fd >= 0:
                    os.close(fd)
    text = log_path(home).read_text()
    assert f"✓ run {busy} (C1) finished" in text
    assert "drained: every run has finished" in text
    # The live panel drew (cursor moves), and the progress lines were kept off it.
    assert b"\x1b[" in shown and f"✓ run {busy} finished".encode() not in shown


async def test_two_stops_a_moment_apart_are_one_drain(tmp_path: Path) -> None:
    # Issue 37 point 5: both `agent stop` read a status file that does not say
    # "draining" yet (it is written at most once a second); two drain requests are
    # one drain all the same, and only `--now` stops.
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with gated_process(home) as (gate, server, harness), \
                trio.open_nursery() as nursery:
            busy = await start_run(server, gate, "work", conversation_id="C1")
            first = await start(nursery, home, "agent", "stop")
            second = await start(nursery, home, "agent", "stop")
            await first.wait_line("draining pid")
            await second.wait_line("draining pid")
            await harness.wait_log("draining: finishing 1 running run(s)")
            assert harness.proc.returncode is None
            await gate.release(busy, "finished")
            assert await first.proc.wait() == 0 and await second.proc.wait() == 0
            assert await harness.wait_clean_exit() == 0
    assert server.run(busy).reply == "finished"
    assert not any("again: stopping" in entry for entry in harness.log)


async def test_logs_n_0_prints_no_line(tmp_path: Path) -> None:
    # Issue 37 point 11: `-n 0` is no line, not the whole log (list[-0:] is all).
    home = tmp_path / "home"
    log_path(home).parent.mkdir(parents=True, exist_ok=True)
    log_path(home).write_text("one\ntwo\n")
    printed = await prohost(home, "agent", "logs", "-n", "0")
    assert (printed.returncode, printed.stdout) == (0, b"")
    last = await prohost(home, "agent", "logs", "-n", "1")
    assert last.stdout == b"two\n"
