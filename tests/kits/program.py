"""The ``prohost`` program as a person runs it: ``python -m prohost`` in a
subprocess, with a home of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import trio


def program_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This process's environment without its ``PROHOST_*`` settings (the person's
    own must not leak in), with the home ``tmp_path/home``, and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROHOST_")}
    env["PROHOST_HOME"] = str(tmp_path / "home")
    env.update(extra)
    return env


def run_cli(tmp_path: Path, *args: str, env: Mapping[str, str] | None = None,
            cwd: Path | None = None, program: Sequence[str] = (sys.executable, "-m", "prohost"),
            ) -> subprocess.CompletedProcess[str]:
    """``prohost ARGS``; what it printed and its exit status.

    It runs in ``cwd`` (by default ``tmp_path``) with the environment ``env`` as
    given (by default :func:`program_env` of ``tmp_path``: its home is
    ``tmp_path/home``). ``program`` is how ``prohost`` is started (a kit's seam,
    such as tests/kits/no_sandbox.py)."""
    return subprocess.run(
        [*program, *args],
        env=program_env(tmp_path) if env is None else dict(env),
        cwd=tmp_path if cwd is None else cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def cli_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without its ``PROHOST_*`` settings, on ``home``,
    with ``extra``."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PROHOST_")}
    env["PROHOST_HOME"] = str(home)
    env.update(extra or {})
    return env


async def prohost(home: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """``python -m prohost ARGS`` on ``home``, run to its end; its output captured."""
    return await trio.run_process([sys.executable, "-m", "prohost", *args],
                                  env=cli_env(home), capture_stdout=True,
                                  capture_stderr=True, check=False, stdin=b"")
