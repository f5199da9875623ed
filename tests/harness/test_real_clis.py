"""A harness run through the real Claude Code and Codex CLIs, as installed by npm.

This machine has no network and no login, so neither CLI can answer; what is
checked is what a user would meet on a machine whose login expired: the run is
reported failed, with the CLI's own reason, in bounded time, and nothing is left
running. `.ci/run` installs the CLIs into a cache folder and names it in
``$PROHOST_REAL_CLIS``; without it the tests skip and say so.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.kits.harness import finished, released, running_harness, running_server

pytestmark = pytest.mark.protocol("§5", "§12", "§13")

#: Absolute, because the agent runs in the harness's workdir, not here.
CLI_ROOT = Path(os.environ.get("PROHOST_REAL_CLIS", ".cache/agent-clis")).resolve()
CLI_DIR = CLI_ROOT / "node_modules" / ".bin"


def real_cli(name: str) -> Path:
    path = CLI_DIR / name
    if not path.exists():
        pytest.skip(f"the real {name} CLI is not installed in {CLI_DIR} "
                    "(.ci/run installs it with npm; npm was missing or offline)")
    return path


# Sync fixtures, so a skip happens before trio starts and keeps its reason.
@pytest.fixture
def claude() -> Path:
    return real_cli("claude")


@pytest.fixture
def codex() -> Path:
    return real_cli("codex")


@pytest.fixture
def isolated_env(tmp_path: Path) -> dict[str, str]:
    """The harness's environment with a HOME of its own: no login of the person
    running the tests can leak in, and the CLIs write their state here."""
    home = tmp_path / "user-home"
    home.mkdir()
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("ANTHROPIC_", "OPENAI_", "CLAUDE", "CODEX"))}
    env["HOME"] = str(home)
    return env


@pytest.fixture
def two_accounts(tmp_path: Path) -> tuple[tuple[str, Path], ...]:
    """Two logins in folders of their own (docs/protocol.md §12), both empty: each run
    must still go to one of them, with the CLI pointed at its folder."""
    accounts = []
    for name in ("first", "second"):
        folder = tmp_path / f"account-{name}"
        folder.mkdir()
        accounts.append((name, folder))
    return tuple(accounts)


async def error_of_a_failed_run(
    tmp_path: Path, env: dict[str, str], accounts: tuple[tuple[str, Path], ...],
    exec_command: str, **options: Any,
) -> str:
    """One turn through a real CLI, with two accounts. It must fail without a reply on
    the first account (not a usage limit: no fail over), and leave nothing running.
    Returns the completion's error."""
    with trio.fail_after(120):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=exec_command, env=env, accounts=accounts,
            **options,
        ) as running:
            run_id = await server.submit_run("say hi", conversation_id="C1")
            await server.wait_until(finished(run_id))
            record = server.run(run_id)
            assert record.state == "failed"
            assert record.completion is not None
            assert "reply" not in record.completion
            assert record.completion["account"] == "first"
            # Confined, as by default (§13), and not failed by it: its own reason.
            assert record.completion["confined"] is True
            assert "permission denied" not in record.completion["error"].lower()
            await released(running.harness, run_id)
            assert len(running.harness.groups) == 0
    error: str = record.completion["error"]
    return error


async def test_claude_without_a_login_is_a_clean_failure(
    tmp_path: Path, isolated_env: dict[str, str], claude: Path,
    two_accounts: tuple[tuple[str, Path], ...],
) -> None:
    error = await error_of_a_failed_run(
        tmp_path, isolated_env, two_accounts, f"{shlex.quote(str(claude))} -p",
        brain="claude", timeout_s=60,
    )
    # As a normal user: "Not logged in · Please run /login". As root, the CLI
    # refuses the unattended-permissions flag before it gets that far.
    assert "log" in error.lower() or "root" in error.lower(), error


async def test_codex_without_a_network_is_stopped_and_reported(
    tmp_path: Path, isolated_env: dict[str, str], codex: Path,
    two_accounts: tuple[tuple[str, Path], ...],
) -> None:
    error = await error_of_a_failed_run(
        tmp_path, isolated_env, two_accounts, shlex.quote(str(codex)),
        brain="codex", timeout_s=20,
    )
    assert "--timeout" in error or "exited" in error, error
