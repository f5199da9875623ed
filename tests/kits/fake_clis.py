"""The fake agent CLIs of tests/agents (fake_claude.py, fake_codex.py) as the
harness meets them: their command lines, the environment that picks a scenario and
records each invocation, programs on disk named ``claude`` / ``codex``, a ledger
seeded with a lane's session, and a turnstile that holds each invocation until the
test lets it go.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

import attrs
import trio

from prohost.engine.accounts.book import DEFAULT_ACCOUNT
from prohost.engine.ledger import Ledger
from tests.kits.harness import Running, finished, released
from tests.kits.paths import AGENTS, logs_folder

#: tests/agents/fake_claude.py as an ``--exec`` line.
FAKE_CLAUDE = f"{shlex.quote(sys.executable)} {shlex.quote(str(AGENTS / 'fake_claude.py'))}"


def claude_env(tmp_path: Path, scenario: str = "reply", **extra: str) -> dict[str, str]:
    """The environment that makes the fake Claude play ``scenario`` and record each
    invocation in ``record.json`` of ``tmp_path``'s logs folder (which the kits let
    a confined run write)."""
    return {**os.environ, "FAKE_CLAUDE_SCENARIO": scenario,
            "FAKE_CLAUDE_RECORD": str(logs_folder(tmp_path) / "record.json"), **extra}


def invocations(tmp_path: Path) -> list[dict[str, Any]]:
    """Every invocation the fake Claude recorded (see :func:`claude_env`)."""
    result: list[dict[str, Any]] = json.loads(
        (logs_folder(tmp_path) / "record.json").read_text())
    return result


def resumed(invocation: dict[str, Any]) -> str | None:
    """The session a fake Claude invocation was asked to resume, if any."""
    for word in invocation["argv"]:
        if word.startswith("--resume="):
            return str(word.split("=", 1)[1])
    return None


def seed_session(home: Path, lane: str, session: str) -> None:
    """The ledger in ``home`` keeps ``session`` as ``lane``'s, as an earlier turn left it."""
    home.mkdir(parents=True, exist_ok=True)
    ledger = Ledger.open(home / "ledger.sqlite3")
    try:
        ledger.save_turn(lane, DEFAULT_ACCOUNT, session, 0.0)
    finally:
        ledger.close()


class Turnstile:
    """The test's end of ``FAKE_CLAUDE_GATE``: each agent invocation, in the order they
    connect, held until the test says go."""

    def __init__(self) -> None:
        self.port = 0
        self._send, self._arrivals = trio.open_memory_channel[trio.SocketStream](10)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._arrived, listeners)

    async def _arrived(self, stream: trio.SocketStream) -> None:
        await self._send.send(stream)
        await trio.sleep_forever()  # the stream is the test's now; keep it open

    async def next(self) -> trio.SocketStream:
        """The next invocation, once it has started and is waiting."""
        stream = await self._arrivals.receive()
        line = b""
        while not line.endswith(b"\n"):
            line += await stream.receive_some()
        return stream


@attrs.frozen
class Cli:
    """One fake agent CLI and the knobs of it these tests turn."""

    name: str
    script: str
    record: str
    refuse: str
    #: A flag the CLI refuses "after an upgrade" (one the brain really appends).
    refused_flag: str

    def resumed(self, argv: list[str]) -> str | None:
        """The session an invocation was asked to resume, from its arguments."""
        if self.name == "claude":
            for word in argv:
                if word.startswith("--resume="):
                    return word.split("=", 1)[1]
            return None
        return argv[argv.index("resume") + 1] if "resume" in argv else None


CLAUDE = Cli("claude", "fake_claude.py", "FAKE_CLAUDE_RECORD", "FAKE_CLAUDE_REFUSE",
             "--dangerously-skip-permissions")
CODEX = Cli("codex", "fake_codex.py", "FAKE_CODEX_RECORD", "FAKE_CODEX_REFUSE",
            "--skip-git-repo-check")


def install(tmp_path: Path, cli: Cli) -> Path:
    """The fake as a program called ``claude`` / ``codex``, as a user installs it."""
    program = tmp_path / "bin" / cli.name
    program.parent.mkdir(exist_ok=True)
    program.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} "
                       f"{shlex.quote(str(AGENTS / cli.script))} \"$@\"\n")
    program.chmod(0o755)
    return program


async def turn(running: Running, text: str) -> dict[str, Any]:
    """One turn of conversation C1, to its completion and the ledger's last step."""
    run_id = await running.server.submit_run(text, conversation_id="C1")
    await running.server.wait_until(finished(run_id))
    # Released: the lane's session and `finished` are committed by now.
    await released(running.harness, run_id)
    return running.server.run(run_id).completion or {}
