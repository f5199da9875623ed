"""A really full filesystem failing a group commit at its COMMIT (issue 27, point 9).

The fault matrix's ``disk_full`` is sqlite's error raised inside one write's
function; here nothing is injected into sqlite: the ledger lives on a tmpfs of
4 MiB (``mount -t tmpfs``, root only: skipped otherwise, and said why), the WAL
is emptied and the filesystem filled to its last block, so every statement of a
batch succeeds in sqlite's page cache and the COMMIT, which must append the
batch's pages to the WAL, is what fails (ENOSPC: "database or disk is full").

- Several ``started`` steps waiting in one batch of the writer thread: each gets
  the error, none is written, and the same steps go through once space returns.
- A run whose ``started`` commit meets the full disk: never spawned; its outcome
  waits for the disk (``finished`` is tried again until written) and is then
  reported once, exactly as the fault matrix's ``started``/``disk_full`` cell
  says; a redelivery is answered 204, and the next run runs.
"""

from __future__ import annotations

import errno
import functools
import os
import sqlite3
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import trio
import trio.testing

from prohost.engine.ledger import Ledger, RunState
from prohost.engine.ledger.steps import LedgerSteps, StepNotWritten
from tests.kits import harness as harness_kit
from tests.kits.faults import Spawns, internal_error, no_process_of_run
from tests.kits.harness import agent_command, finished, running_harness, running_server
from tests.kits.paths import logs_folder
from tests.kits.tmpfs import mounted_tmpfs

pytestmark = [
    pytest.mark.protocol("§7"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a Linux tmpfs"),
]

_T = TypeVar("_T")

#: Bound on every wait for a thread here (s); nothing takes long.
WAIT_S = 30.0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs mounted for the test, unmounted after it whatever happened."""
    with mounted_tmpfs(tmp_path / "disk", "4m") as mount:
        yield mount


def fill(disk: Path) -> Path:
    """Fill ``disk`` to its last block with one file (returned: unlink it to free the
    space), after emptying the ledger's WAL there, so that a commit must grow it."""
    ledger = disk / "ledger.sqlite3"
    if ledger.exists():
        with sqlite3.connect(ledger) as conn:
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        conn.close()
        assert busy == 0, "the WAL could not be emptied"
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for size in (1 << 20, 1 << 16, 1 << 12, 1 << 9, 1):
            chunk = b"\0" * size
            while True:
                try:
                    os.write(fd, chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break
    finally:
        os.close(fd)
    assert os.statvfs(disk).f_bavail == 0
    return filler


class Statements:
    """The transaction statements sqlite ran on ``ledger``'s write connection (its
    trace callback), in order."""

    CONTROL = ("BEGIN", "SAVEPOINT", "RELEASE", "ROLLBACK", "COMMIT")

    def __init__(self, ledger: Ledger) -> None:
        self.seen: list[str] = []
        with ledger._lock:
            assert ledger._conn is not None
            ledger._conn.set_trace_callback(self._saw)

    def _saw(self, statement: str) -> None:
        text = " ".join(statement.split()).upper()
        if text.startswith(self.CONTROL):
            self.seen.append(text)


def admitted(ledger: Ledger, run_ids: list[str]) -> None:
    for run_id in run_ids:
        ledger.admit(run_id, f"lane-{run_id}", "{}", 1.0)


async def test_several_steps_in_one_batch_failing_at_its_commit_each_get_the_error(
    small_disk: Path,
) -> None:
    path = small_disk / "ledger.sqlite3"
    run_ids = [f"run_{n}" for n in range(4)]
    ledger = Ledger.open(path)
    filler = None
    try:
        admitted(ledger, run_ids)
        steps = LedgerSteps(ledger)
        held, release = threading.Event(), threading.Event()

        def hold() -> None:  # a job that keeps the writer thread busy (no write)
            held.set()
            release.wait(WAIT_S)

        errors: dict[str, BaseException] = {}

        async def start(run_id: str) -> None:
            try:
                await steps.started(run_id, f"lane-{run_id}", "work")
            except StepNotWritten as exc:
                errors[run_id] = exc

        with trio.fail_after(WAIT_S):
            async with trio.open_nursery() as writer:
                await writer.start(steps.writer)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(functools.partial(steps._write, hold,
                                                         what="holding the writer"))
                    await trio.to_thread.run_sync(held.wait, WAIT_S)
                    for run_id in run_ids:
                        nursery.start_soon(start, run_id)
                    # Every `started` job is on the writer thread's queue, behind the
                    # held one: the thread takes them all in its next round.
                    await trio.testing.wait_all_tasks_blocked()
                    filler = fill(small_disk)
                    statements = Statements(ledger)
                    release.set()
                writer.cancel_scope.cancel()
        # Each step waiting in the batch got the disk's error, in full.
        assert {run_id: str(exc) for run_id, exc in errors.items()} == {
            run_id: "the ledger step mark_started could not be written: the run ledger "
                    f"{path} failed: database or disk is full"
            for run_id in run_ids}
        # One transaction, every write in it fine (a savepoint each, released), and
        # the COMMIT is what failed: nothing ran after it (sqlite rolled it back).
        assert statements.seen == ["BEGIN IMMEDIATE",
                                   *["SAVEPOINT STEP", "RELEASE STEP"] * len(run_ids),
                                   "COMMIT"], statements.seen
        # Nothing of it was written; with space back, the same steps go through.
        assert {ledger.get(run_id).state for run_id in run_ids} == {RunState.ACCEPTED}
        filler.unlink()
        for run_id in run_ids:
            ledger.mark_started(run_id, 2.0)
            assert ledger.get(run_id).state is RunState.STARTED
    finally:
        ledger.close()
        if filler is not None:
            filler.unlink(missing_ok=True)


class FillingLedger(Ledger):
    """A real ledger on the small disk: the first ``started`` write, once its job is
    taken (before its transaction begins), fills the disk to its last block; the
    second ``finished`` write (the run's first try again: the first met the full
    disk too) frees it."""

    filled: Path | None = None
    finished_tries = 0

    def _write(self, fn: Callable[[sqlite3.Connection], _T], *, what: str,
               durable: bool = True, waits: bool | None = None) -> _T:
        if what == "mark_started" and FillingLedger.filled is None:
            FillingLedger.filled = fill(self.path.parent)
        if what == "mark_finished" and FillingLedger.filled is not None:
            FillingLedger.finished_tries += 1
            if FillingLedger.finished_tries == 2:
                FillingLedger.filled.unlink()
        return super()._write(fn, what=what, durable=durable, waits=waits)


async def test_a_run_whose_started_commit_meets_a_full_disk_is_reported_as_the_matrix_says(
    small_disk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    home = small_disk  # the whole home on the small disk, as in the soak
    marks = logs_folder(tmp_path) / "marks"
    command = agent_command("marker.py", marks)
    spawns = Spawns(monkeypatch)
    monkeypatch.setattr(harness_kit, "Ledger", FillingLedger)
    monkeypatch.setattr(FillingLedger, "filled", None)
    monkeypatch.setattr(FillingLedger, "finished_tries", 0)
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
                server, home, exec_command=command, concurrency=1) as running:
            run_id = await server.submit_run("work", conversation_id="C1")
            await server.wait_until(finished(run_id))
            await running.harness.wait_until(lambda h: run_id not in h.held)
            # Its outcome waited for the disk to be written (never posted before: §7),
            # and went when space returned.
            assert FillingLedger.filled is not None and not FillingLedger.filled.exists()
            assert FillingLedger.finished_tries == 2
            first = server.run(run_id).completion
            assert first == {**(first or {}), "ok": False, "retryable": True,
                             "error": internal_error("started", "disk_full")}, first
            assert spawns.of(run_id) == []
            assert await no_process_of_run(run_id)
            assert server.run(run_id).completion_posts == 1
            # Reported is reported (a redelivery is answered 204, not run), and the
            # next run runs.
            again = await harness_kit.ack_to(running, server.run(run_id).body_text, "again")
            assert again.status == 204, again
            second = await server.submit_run("work", conversation_id="C1")
            await server.wait_until(finished(second))
            await running.harness.wait_until(lambda h: second not in h.held)
            completion = server.run(second).completion
            assert completion is not None and completion["ok"] is True, completion
            assert len(spawns.of(second)) == 1
            assert spawns.of(run_id) == []
            assert running.ledger is not None
            assert running.ledger.get(run_id).state is RunState.REPORTED
