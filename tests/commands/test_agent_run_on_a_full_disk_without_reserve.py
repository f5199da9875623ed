"""``prohost agent run`` on a full disk, on a home that has no ``ledger.reserve``
(issue 27, point 8): a home made by a prohost from before the reserve, or one whose
disk never had the room for it. Its ledger cannot be opened the usual way (the WAL
index, ``-shm``, needs 32 KiB of new blocks), and its ``agent.lock`` is empty (a
clean exit empties it), so writing the pid needs a new block too. It must come up
all the same, say the disk is full, answer 503 for what it cannot record, and run
it once space returns — never advising to move the ledger aside. The full disk is a
real tmpfs filled to the last byte (root only).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from prohost.engine.ledger import RunState
from tests.kits.harness import finished, start_run
from tests.kits.process import harness_process, ledger_row, paired_with_gate
from tests.kits.tmpfs import mounted_tmpfs, run_through_a_full_disk


@pytest.fixture
def home_mount(tmp_path: Path) -> Iterator[Path]:
    """An empty tmpfs of 4 MiB as the home (the test fills it), unmounted after."""
    with mounted_tmpfs(tmp_path / "home", "4m") as home:
        yield home


@pytest.mark.protocol("§7")
async def test_a_home_without_a_reserve_starts_on_a_full_disk_and_recovers(
    home_mount: Path,
) -> None:
    home = home_mount
    with trio.fail_after(60):
        async with paired_with_gate(home) as (gate, server):
            async with harness_process(server, home, gate.command) as first:
                earlier = await start_run(server, gate, "before the disk filled")
                await gate.release(earlier)
                await server.wait_until(finished(earlier))
                first.send_signal(signal.SIGTERM)
                assert await first.wait_clean_exit() == 0

            # As a prohost from before the reserve left it: no reserve, the lock
            # emptied by the clean exit, the ledger closed (no -wal, no -shm).
            (home / "ledger.reserve").unlink()
            assert (home / "agent.lock").stat().st_size == 0
            assert sorted(p.name for p in home.glob("ledger.sqlite3*")) == ["ledger.sqlite3"]
            run_id = await run_through_a_full_disk(server, gate, home, earlier)

    for done in (earlier, run_id):
        assert ledger_row(home, done).state is RunState.REPORTED
