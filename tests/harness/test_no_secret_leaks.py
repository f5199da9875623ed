"""No token, secret or mcp.token where another user or program could read it (issue 8).

A real harness, the reference server and a fake agent behind a wrapper that records
its argv and whole environment; logging captured at DEBUG; the home walked for
files other users may read. Under umask 022 and a home that already existed 0755,
as a new user's machine often has it.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from prohost.home import InstanceLock
from prohost.logfile import log_path, log_to_file
from tests.kits.harness import AGENTS, finished, running_harness, running_server
from tests.kits.paths import logs_folder

pytestmark = pytest.mark.protocol("§1", "§5")

MCP_TOKEN = "mcp-SECRET-5d1e0c"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _wrapped(tmp_path: Path, name: str, script: str) -> str:
    """A program called ``name`` that records argv and env, then runs the fake."""
    program = tmp_path / "bin" / name
    program.parent.mkdir(exist_ok=True)
    program.write_text(
        f"#!/bin/sh\nexec {shlex.quote(sys.executable)} "
        f"{shlex.quote(str(AGENTS / 'secret_dump.py'))} {shlex.quote(sys.executable)} "
        f"{shlex.quote(str(AGENTS / script))} \"$@\"\n"
    )
    program.chmod(0o755)
    return str(program)


def _readable_by_others(home: Path) -> Iterator[Path]:
    for folder, dirs, files in os.walk(home):
        for name in [*dirs, *files]:
            path = Path(folder) / name
            if not path.is_symlink() and _mode(path) & 0o077:
                yield path


@pytest.mark.parametrize("brain", ["plain", "claude", "codex"])
async def test_no_secret_in_logs_argv_environment_or_readable_files(
    tmp_path: Path, brain: str, umask_022: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    os.chmod(home, 0o755)
    logs = logs_folder(tmp_path)
    dump = logs / "dump.jsonl"
    script = {"plain": "reply.py", "claude": "fake_claude.py", "codex": "fake_codex.py"}[brain]
    command = _wrapped(tmp_path, brain if brain != "plain" else "agent", script)
    # Codex's folder of its own: its MCP token goes into a private overlay of it.
    env = {**os.environ, "SECRET_DUMP": str(dump), "CODEX_HOME": str(tmp_path / "codex"),
           "FAKE_CODEX_RECORD": str(logs / "codex-record.json")}
    with trio.fail_after(60):
        async with running_server() as server:
            # As `prohost agent run` does: the lock (which makes the home private)
            # and a log file, before the harness starts.
            with InstanceLock.acquire(home):
                log_to_file(home, logger_name="prohost", level=logging.DEBUG)
                try:
                    async with running_harness(
                        server, home, exec_command=command, brain=brain, env=env,
                    ) as running:
                        run_id = await server.submit_run(
                            "use the tools", conversation_id="C1",
                            mcp={"url": "https://mcp.example/mcp", "token": MCP_TOKEN})
                        await server.wait_until(finished(run_id))
                        creds = running.creds
                        # While the ledger is open, its -wal/-shm exist too.
                        modes = {name: _mode(home / name) for name in (
                            "ledger.sqlite3", "ledger.sqlite3-wal", "ledger.sqlite3-shm",
                            "credentials.json", "status.json") if (home / name).exists()}
                finally:
                    logger = logging.getLogger("prohost")
                    for handler in [h for h in logger.handlers
                                    if getattr(h, "baseFilename", None)]:
                        logger.removeHandler(handler)
                        handler.close()
    completion: dict[str, Any] = server.run(run_id).completion or {}
    secrets = {"token": creds.token, "secret": creds.secret, "mcp.token": MCP_TOKEN}

    # Not in any log line.
    logged = caplog.text + log_path(home).read_text("utf-8", "replace")
    for name, value in secrets.items():
        assert value not in logged, f"the {name} is in the log"
        assert value not in json.dumps(completion), f"the {name} is in the completion"

    # Not in any argv or environment of a child: every command the agent runs
    # inherits its environment (issue 8).
    children = [json.loads(line) for line in dump.read_text().splitlines()] if dump.exists() else []
    if brain == "plain":
        # The plain brain cannot use an MCP server: the run fails before any spawn.
        assert completion["ok"] is False and "MCP" in completion["error"]
    else:
        assert completion["ok"] is True, completion
        assert children, "the agent never started"
    for child in children:  # the agent's turn, and `--version` probes
        argv = " ".join(child["argv"])
        for name, value in secrets.items():
            assert value not in argv, f"the {name} is in the agent's argv"
        environment = dict(child["env"])
        for name, value in secrets.items():
            carriers = [key for key, text in environment.items() if value in text or value in key]
            assert not carriers, f"the {name} is in the agent's environment: {carriers}"
    if brain == "codex":
        # Codex had the token all the same: in the overlay's private config.toml.
        turns = json.loads((logs / "codex-record.json").read_text())
        assert turns[-1]["mcp_server"]["http_headers"] == {
            "Authorization": f"Bearer {MCP_TOKEN}"}
        assert not any(MCP_TOKEN in p.read_text() for p in (tmp_path / "codex").rglob("*")
                       if p.is_file())

    # Not in any file another user could read; and the private files are private.
    for path in _readable_by_others(home):
        if path.is_file():
            content = path.read_bytes()
            for name, value in secrets.items():
                assert value.encode() not in content, f"the {name} is in {path} (world-readable)"
    assert _mode(home) == 0o700
    assert _mode(home / "runs") == 0o700
    assert {"ledger.sqlite3", "ledger.sqlite3-wal", "ledger.sqlite3-shm"} <= modes.keys()
    assert modes == dict.fromkeys(modes, 0o600)
    assert _mode(log_path(home)) == 0o600
    assert _mode(log_path(home).parent) == 0o700
    # And the ledger really did hold the token: the modes above are what protect it.
    assert MCP_TOKEN.encode() in (home / "ledger.sqlite3").read_bytes()
