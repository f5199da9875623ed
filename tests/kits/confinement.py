"""A person's machine for the confinement tests (§13): a home with secrets and dotfiles,
a checkout, the harness's home beside them (``World``), the prober agent and how its
lines read."""

from __future__ import annotations

import os
import shlex
import socket
import sys
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

from tests.kits.harness import (
    Running,
    ServerHandle,
    finished,
    running_harness,
)
from tests.kits.paths import AGENTS, logs_folder
from tests.kits.repos import isolate_git, lane_folder

PROBER = AGENTS / "prober.py"


def prober(*ops: str) -> str:
    return shlex.join([sys.executable, str(PROBER), *ops])


class World:
    """A machine as a person has it: a home with secrets and dotfiles, a checkout,
    and the harness's own home beside them."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.user = tmp_path / "user"
        (self.user / ".ssh").mkdir(parents=True)
        (self.user / ".ssh" / "id_ed25519").write_text("a private key\n")
        (self.user / ".ssh" / "config").write_text("Host *\n")
        (self.user / ".profile").write_text("export EDITOR=vi\n")
        self.home = tmp_path / "home"
        self.source = tmp_path / "src" / "app"
        self.logs = logs_folder(tmp_path)
        self.env = {**os.environ, "HOME": str(self.user),
                    "GIT_AUTHOR_NAME": "Agent", "GIT_AUTHOR_EMAIL": "agent@example.invalid",
                    "GIT_COMMITTER_NAME": "Agent",
                    "GIT_COMMITTER_EMAIL": "agent@example.invalid"}

    def harness(self, server: ServerHandle, command: str,
                **options: Any) -> AbstractAsyncContextManager[Running]:
        """The harness on this world's home, ``command`` its plain brain's agent."""
        return running_harness(server, self.home, exec_command=command, brain="plain",
                               env=self.env, **options)

    def worktree(self, conversation: str) -> Path:
        return lane_folder(self.home, f"conv:{conversation}") / "app"


@pytest.fixture(name="world")
def world_fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    isolate_git(tmp_path, monkeypatch)
    yield World(tmp_path)


def results(completion: dict[str, Any] | None) -> dict[str, str]:
    """The prober's ``NAME=RESULT`` lines, from the run's reply, each refusal §13
    allows said as ``denied``: a write's ``EACCES``, ``EPERM`` or ``EROFS``, a
    read's ``EACCES`` or ``ENOENT``, or a hidden folder's empty listing."""
    assert completion is not None and completion["ok"] is True, completion
    found = dict(line.split("=", 1) for line in completion["reply"].splitlines())
    return {name: "denied" if said in DENIED else said for name, said in found.items()}


#: Refusals as §13 allows them (a hidden folder lists as empty).
DENIED = {"EACCES", "EPERM", "EROFS", "ENOENT", "empty"}


async def turn(server: Any, conversation: str) -> dict[str, Any]:
    run_id = await server.submit_run("probe", conversation_id=conversation)
    await server.wait_until(finished(run_id))
    completion: dict[str, Any] = server.run(run_id).completion
    return completion


def listening(address: str | Path) -> socket.socket:
    """A Unix socket of the person's at ``address`` (a leading NUL: an abstract
    name), listening, never blocking."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(address))
    listener.listen(8)
    listener.setblocking(False)
    return listener


def accepted_any(listener: socket.socket) -> bool:
    """Whether anything has connected to ``listener`` (what a run reached)."""
    try:
        conn, _ = listener.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True
