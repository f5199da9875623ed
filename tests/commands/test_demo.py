"""`prohost demo` is the newcomer's first command: it must work, and clean up."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import trio


def demo_dirs() -> set[str]:
    return {name for name in os.listdir(tempfile.gettempdir()) if name.startswith("prohost-demo-")}


async def test_demo_runs_a_dozen_runs_and_leaves_nothing_behind(tmp_path: Path) -> None:
    before = demo_dirs()
    env = {**os.environ, "COLUMNS": "200", "PROHOST_HOME": str(tmp_path / "untouched")}
    with trio.fail_after(120):
        result = await trio.run_process(
            [sys.executable, "-m", "prohost", "demo"],
            capture_stdout=True, capture_stderr=True, env=env, check=False,
        )
    out = result.stdout.decode()
    err = result.stderr.decode()
    assert result.returncode == 0, err
    assert "prohost demo results" in out
    assert out.count("completed") == 12
    # What each run did (§7): the stand-in notes each request in its conversation's
    # worktree of the demo repository, commits it and leaves a scratch file, and
    # reports pretend usage, marked as such.
    assert out.count("2 files (+2 −0), 1 commit") == 12
    assert out.count(" tok $0.") == 12
    assert "pretend figures" in out
    # Progress is shown while it works (stdout is not a terminal here, so the
    # panel degrades to one log line per change).
    assert "prohost.panel" in err
    assert "started" in err and "finished in" in err
    assert demo_dirs() == before
    assert not (tmp_path / "untouched").exists()
    leftover = await trio.run_process(["pgrep", "-f", "prohost.commands.demo_agent"],
                                      capture_stdout=True, check=False)
    assert leftover.stdout == b""
