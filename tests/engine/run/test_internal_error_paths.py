"""An exception no step expected becomes the run's ``internal error: …`` (§7), and
that text names no local path: the harness's home, the working directory, the
person's repositories and any other absolute path an ``OSError`` names are written
as placeholders. Through the whole harness and the reference server: the completion
checked is the one the server received."""

from __future__ import annotations

import errno
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from prohost.engine.run import workspace
from tests.kits.harness import finished, running_harness, running_server
from tests.kits.paths import AGENTS

pytestmark = pytest.mark.protocol("§7")


async def test_an_internal_error_names_no_local_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    home, workdir = tmp_path / "home", tmp_path / "work"
    elsewhere = "/srv/prohost-elsewhere/notes.txt"

    def failing_step(*_: Any, **__: Any) -> str:
        # A step failing on a file of the harness's home, naming another path too
        # (as os.rename does), and the working directory in its words.
        raise PermissionError(errno.EACCES, f"Permission denied under {workdir}",
                              str(home / "runs" / "r1" / "mcp.json"), None, elsewhere)

    monkeypatch.setattr(workspace, "prompt_for", failing_step)
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, home, exec_command=f"{sys.executable} {AGENTS / 'reply.py'} hi",
            workdir=workdir,
        ):
            run_id = await server.submit_run("hello", conversation_id="C1")
            await server.wait_until(finished(run_id))
    completion = server.run(run_id).completion or {}
    assert completion["ok"] is False and completion["retryable"] is True
    assert completion["error"] == (
        "internal error: PermissionError: [Errno 13] Permission denied under <workdir>: "
        "'$PROHOST_HOME/runs/r1/mcp.json' -> '<local path>'")
    assert str(tmp_path) not in str(completion)
