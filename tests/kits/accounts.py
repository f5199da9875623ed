"""Agent accounts for tests (docs/protocol.md §12): a config folder per account, the
fake CLI's usage limit switched on in one (at once, or after it spent), a run that
fails over from one account to the next, which account each invocation ran with,
and a ledger seeded the way a restart finds it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import trio

from prohost.engine.ledger import Ledger
from prohost.server import ServerHandle
from prohost.wire.runs import parse_body
from tests.kits.fake_clis import FAKE_CLAUDE, claude_env, invocations
from tests.kits.harness import finished, running_harness, running_server


def folders(tmp_path: Path, *names: str) -> tuple[tuple[str, Path], ...]:
    """One empty config folder per account name, as ``Options.accounts``."""
    made = []
    for name in names:
        folder = tmp_path / f"cfg-{name}"
        folder.mkdir()
        made.append((name, folder))
    return tuple(made)


def limit(folder: Path, until: float) -> None:
    """Make the fake CLI refuse work on this account until ``until``."""
    (folder / "limit").write_text(f"{int(until)}\n")


def spent_then_limited(folder: Path) -> None:
    """The fake CLI on this account works (spending $0.0342), then hits its limit."""
    (folder / "limit").write_text(f"{int(time.time() + 3600)} spent\n")


async def fail_over_once(tmp_path: Path, exec_command: str = FAKE_CLAUDE,
                         **options: Any) -> dict[str, Any]:
    """The completion of one run through the whole harness (brain ``claude``, the
    fake CLI's env, ``options`` as :func:`running_harness` takes them) on accounts a
    (which spends, then reaches its limit: :func:`spent_then_limited`) and b."""
    accounts = folders(tmp_path, "a", "b")
    spent_then_limited(dict(accounts)["a"])
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=exec_command, brain="claude",
            env=claude_env(tmp_path), accounts=accounts, **options,
        ):
            run_id = await server.submit_run("a costly question", conversation_id="C1")
            await server.wait_until(finished(run_id))
    completion = server.run(run_id).completion
    assert completion is not None
    return completion


def accounts_used(tmp_path: Path) -> list[str]:
    """Which account folder each invocation of the fake CLI ran with, by name."""
    return [Path(i["login_dir"]).name.removeprefix("cfg-") for i in invocations(tmp_path)]


def seed(home: Path, server: ServerHandle, run_ids: list[str],
         limits: dict[str, float]) -> None:
    """The ledger a restart finds: ``run_ids`` accepted, never started, and the
    accounts' limits remembered."""
    home.mkdir(parents=True, exist_ok=True)
    with Ledger.open(home / "ledger.sqlite3") as ledger:
        for run_id in run_ids:
            body = server.run(run_id).body_text
            ledger.admit(run_id, parse_body(body).lane, body, time.time())
        ledger.save_account_limits(limits)
