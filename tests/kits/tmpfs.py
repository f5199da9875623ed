"""A real full filesystem for the tests that need one: a small tmpfs mounted for the
test (root only; the test is skipped, saying why, where it cannot be), and a file
that fills it to its last byte."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.kits.harness import finished
from tests.kits.process import harness_process


@contextmanager
def mounted_tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """``folder`` (made, mode 0700) with a tmpfs of ``size`` (``4m``) mounted on it,
    unmounted when the block ends whatever happened there (detached lazily when a
    failed test still holds a file open on it)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    folder.mkdir(mode=0o700, exist_ok=True)
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(folder)],
            capture_output=True, text=True, timeout=30)
    except OSError as exc:
        pytest.skip(f"no mount command here: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield folder
    finally:
        if subprocess.run(["umount", str(folder)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(folder)], check=True)


def fill(path: Path) -> None:
    """Write ``path`` until its filesystem has no byte left."""
    with open(path, "wb", buffering=0) as file:
        for size in (1 << 20, 1):
            try:
                while True:
                    file.write(b"\0" * size)
            except OSError:
                continue


async def run_through_a_full_disk(server: Any, gate: Any, home: Path, earlier: str) -> str:
    """Fill ``home``'s tmpfs, start a harness there (``earlier``: a run it finished
    before), and see it come up saying the disk is full, answer 503 for a new run,
    then run that run once the space returns, report it and exit cleanly, never
    advising to move the ledger aside; the new run's id. The server and the agent
    gate are :func:`tests.kits.process.paired_with_gate`'s."""
    fill(home / "filler")
    async with harness_process(server, home, gate.command) as harness:
        await harness.wait_log("disk is full")
        run_id: str = await server.submit_run("while the disk is full")
        await server.wait_until(lambda s: 503 in s.runs[run_id].ack_statuses)
        assert gate.started == [earlier]

        (home / "filler").unlink()  # space returns
        await gate.wait_started(run_id)
        await gate.release(run_id)
        await server.wait_until(finished(run_id))
        assert server.run(run_id).completion["ok"] is True
        harness.send_signal(signal.SIGTERM)
        assert await harness.wait_clean_exit() == 0
        assert not any("move it aside" in line for line in harness.log)
        assert not any("Traceback" in line for line in harness.log)
    return run_id
