"""The fake ACP agent of tests/agents/fake_acp.py as the tests meet it: its
``--exec`` line and the environment that picks its scenario, keeps its sessions and
records what it is sent."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from prohost.server import ServerHandle
from tests.kits.harness import Running, running_harness, running_server
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
