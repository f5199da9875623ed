"""The fake ACP agent of tests/agents/fake_acp.py as the tests meet it: its
``--exec`` line and the environment that picks its scenario, keeps its sessions and
records what it is sent."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from tests.kits.paths import AGENTS

#: tests/agents/fake_acp.py as an ``--exec`` line.
FAKE_ACP = f"{shlex.quote(sys.executable)} {shlex.quote(str(AGENTS / 'fake_acp.py'))}"


def acp_env(tmp_path: Path, scenario: str = "reply", **extra: str) -> dict[str, str]:
    """The environment that makes the fake agent play ``scenario``, keep its sessions
    in ``tmp_path/sessions`` and record every message in ``tmp_path/record.jsonl``."""
    return {**os.environ, "FAKE_ACP_SCENARIO": scenario,
            "FAKE_ACP_STATE": str(tmp_path / "sessions"),
            "FAKE_ACP_RECORD": str(tmp_path / "record.jsonl"), **extra}
