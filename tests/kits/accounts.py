"""Agent accounts for tests (docs/protocol.md §12): a config folder per account, the
fake CLI's usage limit switched on in one, which account each invocation ran with,
and a ledger seeded the way a restart finds it.
"""

from __future__ import annotations

import time
from pathlib import Path

from prohost.engine.ledger import Ledger
from prohost.server import ServerHandle
from prohost.wire.runs import parse_body
from tests.kits.fake_clis import invocations


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


def accounts_used(tmp_path: Path) -> list[str]:
    """Which account folder each invocation of the fake CLI ran with, by name."""
    return [Path(i["config_dir"]).name.removeprefix("cfg-") for i in invocations(tmp_path)]


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
