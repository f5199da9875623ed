"""Small real git repositories and what ``changes`` says of them (the §7 ``changes``
tests)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from prohost.engine.repos import changes
from prohost.engine.repos.changes import CheckoutState
from prohost.wire.protocol import converter


async def compare(before: CheckoutState, *, limit_s: float = changes.CHANGES_LIMIT_S) -> Any:
    """The entry as the completion sends it (§7's JSON), read unconfined."""
    return converter.unstructure(await changes.CheckoutReader().compare(before, limit_s=limit_s))


def git(repo: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.com")
    return subprocess.run(["git", "-C", str(repo), *args], check=True, env=env,
                          capture_output=True, text=True).stdout


def make_repo(path: Path, files: dict[str, str | bytes] | None = None) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    for name, content in (files or {}).items():
        write(path / name, content)
    if files:
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", "start")
    return path


def write(path: Path, content: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)


def by_path(entry: dict[str, object]) -> dict[str, dict[str, object]]:
    files = entry["files"]
    assert isinstance(files, list)
    return {row["path"]: row for row in files}
