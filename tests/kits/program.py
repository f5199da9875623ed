"""The ``prohost`` program as a person runs it: ``python -m prohost`` in a
subprocess, with a home of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``prohost ARGS`` in ``tmp_path`` with the home ``tmp_path/home``; what it printed
    and its exit status."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROHOST_")}
    env["PROHOST_HOME"] = str(tmp_path / "home")
    return subprocess.run(
        [sys.executable, "-m", "prohost", *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
