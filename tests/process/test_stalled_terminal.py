"""A terminal that stops reading (issue 8): the harness's stdout and stderr are a
pipe that is full and that nobody reads — a stalled SSH session, a pager left open.

Before, the first log line blocked the event loop for good: no connection, no acks,
no pongs, no heartbeats. Now terminal output is written without blocking
(prohost/engine/view/termout.py) and the harness goes on serving the server.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import signal
import termios
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from prohost.engine.view.termout import BACKLOG_LIMIT_BYTES, NonBlockingOutput
from prohost.wire.protocol import Heartbeat, Pong
from tests.kits.harness import finished, start_run
from tests.kits.process import gated_process

#: Linux's fcntl to resize a pipe (not in the fcntl module before Python 3.10 on all builds).
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


def full_pipe() -> tuple[int, int]:
    """A pipe as small as Linux allows, filled to the brim; its write end is left
    blocking, as a terminal's or a parent's pipe is."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, F_SETPIPE_SZ, 4096)
    os.set_blocking(write_end, False)
    try:
        while True:
            os.write(write_end, b"x" * 4096)
    except BlockingIOError:
        pass
    os.set_blocking(write_end, True)
    return read_end, write_end


def test_output_beyond_the_backlog_is_dropped_and_said_once_the_reader_is_back() -> None:
    read_end, write_end = full_pipe()
    with os.fdopen(write_end, "w") as target:
        out = NonBlockingOutput(target)
        line = "a log line\n"
        for _ in range(BACKLOG_LIMIT_BYTES // len(line) * 2):
            out.write(line)  # would block on the first one if it were a plain write
        assert out.dropped > 0
        # The shared pipe's own flags are untouched: the parent still blocks on it.
        assert os.get_blocking(write_end)
        os.set_blocking(read_end, False)
        received = b""
        while True:
            out.flush()
            try:
                chunk = os.read(read_end, 1 << 16)
            except BlockingIOError:
                break
            received += chunk
        assert b"a log line\n" in received
        assert b" bytes of output dropped: the terminal was not reading]\n" in received
        out.close()
    os.close(read_end)


def stalled_terminal() -> tuple[int, int]:
    """A pseudo-terminal whose output is suspended, as Ctrl-S (XOFF) does: every
    write to it blocks until output resumes, which it never does here (a stalled
    SSH session behaves the same). Returns (master, slave)."""
    master, slave = pty.openpty()
    termios.tcflow(slave, termios.TCOOFF)
    os.set_blocking(slave, False)
    try:
        os.write(slave, b"x")
        raise AssertionError("the terminal's output is not suspended")
    except BlockingIOError:
        pass
    os.set_blocking(slave, True)
    return master, slave


@pytest.mark.protocol("§2", "§3")
@pytest.mark.parametrize(
    "stalled", [full_pipe, stalled_terminal], ids=["full-unread-pipe", "suspended-terminal"]
)
async def test_a_stalled_terminal_never_blocks_acks_pongs_or_heartbeats(
    tmp_path: Path, stalled: Callable[[], tuple[int, int]]
) -> None:
    """On a pipe the harness writes plain log lines; on a terminal it draws the live
    panel (rich) and logs through it. Either way its first line ("connecting to …")
    or the panel's first frame used to block the event loop for good."""
    other_end, output = stalled()
    try:
        with trio.fail_after(60):
            async with gated_process(
                tmp_path / "home", output=output, heartbeat_s=5
            ) as (gate, server, harness):
                # Connected: it got past its first log lines.
                run_id = await start_run(server, gate, "work", conversation_id="A")
                assert server.run(run_id).ack_statuses == [200]

                await server.send_raw(json.dumps({"type": "ping", "id": "stalled"}))
                await server.wait_until(lambda s: any(
                    isinstance(m, Pong) and m.id == "stalled" for m in s.messages(Pong)))
                await server.wait_until(lambda s: any(
                    isinstance(m, Heartbeat) and run_id in [r.run_id for r in m.runs]
                    for m in s.messages(Heartbeat)))

                await gate.release(run_id, "answered")
                await server.wait_until(finished(run_id))
                assert server.run(run_id).reply == "answered"
                harness.send_signal(signal.SIGTERM)
                assert await harness.proc.wait() == 0
    finally:
        os.close(other_end)
        os.close(output)
