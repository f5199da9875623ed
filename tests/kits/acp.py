"""The fake ACP agent of tests/agents/fake_acp.py as the tests meet it: its
``--exec`` line and the environment that picks its scenario, keeps its sessions and
records what it is sent."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

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
