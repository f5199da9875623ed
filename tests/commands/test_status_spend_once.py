"""``agent status --json`` lists one account's spend once (issue 31, point 11).

With a single account the all-accounts row (``"account": null``) repeated the
account's numbers, and a script summing ``spend_today`` counted them twice. A real
server, a paired harness with ``--exec cat`` and one run: one row, the default
account's.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from prohost import cli
from tests.kits.clisession import background, banner_field, clean_env, run

ROOT = Path(cli.__file__).parents[1]
PROHOST = [sys.executable, "-m", "prohost"]


def _spend_once_counted(env: dict[str, str]) -> list[dict[str, object]]:
    """``spend_today`` once the harness's status file has counted the run: the file
    is rewritten at most once a second, so ``agent status`` is asked again until it
    has (each call paces the next; no sleep), for a minute at most."""
    deadline = time.monotonic() + 60
    while True:
        status = run([*PROHOST, "agent", "status", "--json"], env, ROOT)
        spend: list[dict[str, object]] = json.loads(status.stdout)["spend_today"]
        if spend or time.monotonic() > deadline:
            return spend


def test_one_account_is_one_spend_row(tmp_path: Path) -> None:
    env = clean_env(tmp_path / "home")
    with background([*PROHOST, "server", "--port", "0"], env, ROOT) as server:
        ws, http = banner_field(server, "WebSocket:"), banner_field(server, "HTTP:")
        paired = run([*PROHOST, "agent", "pair", "--code", banner_field(server, "pairing code:"),
                      "--url", ws], env, ROOT)
        assert paired.returncode == 0, paired
        with background([*PROHOST, "agent", "run", "--no-panel", "--url", ws, "--exec", "cat",
                         "--workdir", str(tmp_path / "work")], env, ROOT) as harness:
            harness.wait_line("connected to")
            sent = run([*PROHOST, "send", "--server", http, "--wait", "hello"], env, ROOT)
            assert sent.returncode == 0, sent
            harness.wait_line("✓ run", "finished")
            spend = _spend_once_counted(env)
    assert [row["account"] for row in spend] == ["default"], spend
    assert spend[0]["runs"] == 1
