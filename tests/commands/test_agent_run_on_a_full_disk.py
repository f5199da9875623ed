"""``prohost agent run`` on a home whose disk is full (issue 16, then issue 27).

A home that holds a ledger comes up on a full disk: it says the disk is full,
answers 503 for what it cannot record, and runs the next delivery once space
returns, every earlier row still there. A home that never had a ledger cannot
create one: one clear line and exit 1, never a traceback, never the advice to move
a ledger aside. The full disk is a real tmpfs filled to the last byte (root only).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from prohost.engine.ledger import RunState
from prohost.home import Credentials, save_credentials
from tests.kits.harness import finished, start_run
from tests.kits.paths import ROOT
from tests.kits.process import harness_process, ledger_row, paired_with_gate
from tests.kits.tmpfs import fill, mounted_tmpfs, run_through_a_full_disk


def pair(home: Path) -> None:
    """Credentials for a server nobody needs to run: the harness must stop before
    it connects."""
    save_credentials(home, Credentials(token="t" * 20, secret="s" * 20,
                                       ws_url="ws://127.0.0.1:9/v1/agent/ws"))


def start(home: Path) -> subprocess.CompletedProcess[str]:
    """``prohost agent run`` on ``home``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROHOST_")}
    env["PROHOST_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "prohost", "agent", "run", "--exec", "true", "--no-panel"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def full_tmpfs(tmp_path: Path) -> Iterator[Path]:
    # Without root the /dev/full case covers the rest.
    with mounted_tmpfs(tmp_path / "home", "1m") as home:
        yield home
    assert not home.is_mount()


def test_a_full_home_that_never_had_a_ledger_says_so_and_exits_1(full_tmpfs: Path) -> None:
    """No ledger can be created there (and no reserve was ever kept): one line that
    says the disk is full, and never that a ledger should be moved aside."""
    pair(full_tmpfs)
    fill(full_tmpfs / "filler")
    result = start(full_tmpfs)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert f"cannot open the run ledger {full_tmpfs / 'ledger.sqlite3'} now" in result.stderr
    assert "is its disk full" in result.stderr
    assert "move it aside" not in result.stderr


@pytest.fixture
def full_home_mount(tmp_path: Path) -> Iterator[Path]:
    """An empty tmpfs of 4 MiB as the home (the test fills it), unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(home)],
                   check=True)
    try:
        yield home
    finally:
        subprocess.run(["umount", "-l", str(home)], check=True)


@pytest.mark.protocol("§7")
async def test_a_harness_started_on_a_full_disk_comes_up_answers_503_and_recovers(
    full_home_mount: Path,
) -> None:
    """Issue 27, point 8: no harness could start while its home's disk was full, and
    the message advised moving the ledger aside (forgetting every run in it)."""
    home = full_home_mount
    with trio.fail_after(60):
        async with paired_with_gate(home) as (gate, server):
            async with harness_process(server, home, gate.command) as first:
                earlier = await start_run(server, gate, "before the disk filled")
                await gate.release(earlier)
                await server.wait_until(finished(earlier))
                first.send_signal(signal.SIGTERM)
                assert await first.wait_clean_exit() == 0

            run_id = await run_through_a_full_disk(server, gate, home, earlier)

    for done in (earlier, run_id):
        assert ledger_row(home, done).state is RunState.REPORTED
