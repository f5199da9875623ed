"""The run ledger (docs/protocol.md §3, §7) against real sqlite files and real processes."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import trio

from prohost.engine import ledger as ledger_module
from prohost.engine.accounts.book import DEFAULT_ACCOUNT
from prohost.engine.ledger import (
    Admitted,
    Ledger,
    LedgerError,
    RunState,
)
from prohost.engine.ledger import schema as ledger_schema
from prohost.wire.runs import Outcome
from tests.kits.ledger import Commits
from tests.kits.paths import LEDGER_CRASH_CHILD


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.sqlite3"


@pytest.fixture
def ledger(path: Path) -> Iterator[Ledger]:
    opened = Ledger.open(path)
    yield opened
    opened.close()


def outcome(reply: str = "done") -> str:
    return Outcome(ok=True, reply=reply).to_json()


# -- admission ----------------------------------------------------------------------


@pytest.mark.protocol("§3", "§7")
def test_admission_over_the_life_of_a_run(ledger: Ledger) -> None:
    body = '{"run_id": "run-1", "text": "héllo ☃"}'
    assert ledger.admit("run-1", "conv:C1", body, now=10.0) is Admitted.NEW
    # A redelivery never inserts again and never replaces the saved body.
    assert ledger.admit("run-1", "conv:C1", '{"other": 1}', now=11.0) is Admitted.HELD
    row = ledger.get("run-1")
    assert row is not None
    assert (row.state, row.body, row.lane, row.accepted_at) == (
        RunState.ACCEPTED, body, "conv:C1", 10.0,
    )

    ledger.mark_started("run-1", now=12.0)
    ledger.record_pgid("run-1", 777)
    assert ledger.admit("run-1", "conv:C1", body, now=13.0) is Admitted.HELD
    ledger.mark_finished("run-1", outcome(), now=14.0)
    assert ledger.admit("run-1", "conv:C1", body, now=15.0) is Admitted.HELD
    ledger.mark_reported("run-1", "posted: 200", now=16.0)
    assert ledger.admit("run-1", "conv:C1", body, now=17.0) is Admitted.REPORTED

    row = ledger.get("run-1")
    assert row is not None
    assert row.state is RunState.REPORTED
    assert (row.started_at, row.pgid, row.reported_at, row.settlement) == (
        12.0, 777, 16.0, "posted: 200",
    )
    assert row.finished_at == 14.0
    assert row.outcome is not None
    assert Outcome.from_json(row.outcome) == Outcome(ok=True, reply="done")
    assert ledger.get("run-unknown") is None


@pytest.mark.protocol("§3", "§7")
def test_a_one_mebibyte_body_is_stored_exactly(ledger: Ledger) -> None:
    body = '{"text": "' + "é" * (512 * 1024 - 8) + '"}'
    assert len(body.encode()) > 1024 * 1024 - 32
    ledger.admit("run-big", "run:run-big", body, now=1.0)
    row = ledger.get("run-big")
    assert row is not None and row.body == body


@pytest.mark.protocol("§7")
async def test_concurrent_admits_from_threads_insert_once(ledger: Ledger) -> None:
    """The harness calls through trio.to_thread; one lock keeps each call whole."""
    with trio.fail_after(30):
        results: list[Admitted] = []

        async def admit(run_id: str) -> None:
            results.append(
                await trio.to_thread.run_sync(ledger.admit, run_id, "lane", "{}", 1.0)
            )

        async with trio.open_nursery() as nursery:
            for index in range(20):
                nursery.start_soon(admit, "run-same")
                nursery.start_soon(admit, f"run-{index}")

    assert results.count(Admitted.NEW) == 21
    assert results.count(Admitted.HELD) == 19
    seqs = [row.seq for row in ledger.recover().pending]
    assert len(seqs) == len(set(seqs)) == 21


# -- recovery ------------------------------------------------------------------------


@pytest.mark.protocol("§7")
def test_recovery_classifies_each_state_in_accept_order(path: Path) -> None:
    with Ledger.open(path) as ledger:
        # Accept order deliberately differs from name order and from the clock.
        for index, run_id in enumerate(["p-z", "i-b", "p-a", "o-c", "r-d", "o-q", "p-m", "i-a"]):
            ledger.admit(run_id, f"conv:{run_id}", "{}", now=1000.0 - index)
        ledger.mark_started("i-b", now=1.0)
        ledger.record_pgid("i-b", 4321)
        ledger.mark_started("i-a", now=2.0)
        ledger.mark_started("o-c", now=3.0)
        ledger.mark_finished("o-c", outcome("c"), now=4.0)
        # A queued run cancelled before it started still has an outcome to post.
        ledger.mark_finished("o-q", outcome("q"), now=5.0)
        ledger.mark_reported("r-d", "dropped: unknown to the server", now=6.0)

    with Ledger.open(path) as ledger:
        recovery = ledger.recover()
    assert [row.run_id for row in recovery.pending] == ["p-z", "p-a", "p-m"]
    assert [row.run_id for row in recovery.interrupted] == ["i-b", "i-a"]
    assert [row.run_id for row in recovery.outbox] == ["o-c", "o-q"]
    assert recovery.interrupted[0].pgid == 4321
    assert recovery.interrupted[1].pgid is None
    assert [Outcome.from_json(row.outcome or "").reply for row in recovery.outbox] == ["c", "q"]
    all_rows = recovery.pending + recovery.interrupted + recovery.outbox
    assert all(row.seq > 0 for row in all_rows)
    assert sorted(row.seq for row in recovery.pending) == [row.seq for row in recovery.pending]


@pytest.mark.protocol("§7")
def test_accept_order_stays_monotonic_after_pruning_the_newest(ledger: Ledger) -> None:
    ledger.admit("run-1", "lane", "{}", now=0.0)
    ledger.admit("run-2", "lane", "{}", now=0.0)
    ledger.mark_reported("run-2", "dropped", now=0.0)
    first = ledger.get("run-1")
    second = ledger.get("run-2")
    assert first is not None and second is not None
    # Past the tombstone window too: the row is deleted, not just emptied.
    assert ledger.prune(now=31 * 86400) == 1
    assert ledger.get("run-2") is None
    ledger.admit("run-3", "lane", "{}", now=31 * 86400)
    third = ledger.get("run-3")
    assert third is not None
    assert first.seq < second.seq < third.seq


@pytest.mark.protocol("§7")
def test_every_committed_step_survives_sigkill(path: Path) -> None:
    child = subprocess.run(
        [sys.executable, str(LEDGER_CRASH_CHILD), str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert child.stdout.splitlines()[-1] == "uncommitted", child.stdout
    # The child never closed the ledger: what it committed is still only in the WAL.
    assert Path(f"{path}-wal").stat().st_size > 0

    with Ledger.open(path) as ledger:
        recovery = ledger.recover()
        assert [row.run_id for row in recovery.pending] == ["run-c", "run-d"]
        assert [row.run_id for row in recovery.interrupted] == ["run-a"]
        assert recovery.interrupted[0].pgid == 4242
        assert recovery.interrupted[0].started_at == 110.0
        assert [row.run_id for row in recovery.outbox] == ["run-b"]
        assert Outcome.from_json(recovery.outbox[0].outcome or "").reply == "done"
        reported = ledger.get("run-e")
        assert reported is not None and reported.state is RunState.REPORTED
        assert ledger.account_session("conv:0", DEFAULT_ACCOUNT) == "sess-1"
        assert ledger.get("run-uncommitted") is None
        assert ledger.admit("run-a", "conv:1", "{}", now=200.0) is Admitted.HELD


# A kill -9 at each step of a run's life, through the runner's real steps, is in
# tests/engine/ledger/test_fault_matrix.py (the kill cells).


@pytest.mark.protocol("§7")
def test_durable_steps_are_fsynced_in_wal_mode_and_the_others_not(
    ledger: Ledger, path: Path
) -> None:
    with sqlite3.connect(path) as other:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"

    def synchronous() -> int:
        # Per connection, so it is read from the ledger's own write connection: FULL
        # (2) fsyncs the WAL on every commit, NORMAL (1) does not.
        assert ledger._conn is not None
        assert not ledger._conn.in_transaction
        return int(ledger._conn.execute("PRAGMA synchronous").fetchone()[0])

    commits = Commits(ledger)
    ledger.admit("run-1", "lane", "{}", now=1.0)
    assert synchronous() == 2
    ledger.mark_started("run-1", now=2.0)
    assert synchronous() == 2
    ledger.record_pgid("run-1", 4242)
    assert synchronous() == 2
    ledger.save_turn("lane", DEFAULT_ACCOUNT, "sess-1", now=3.0, durable=False)
    assert synchronous() == 1
    ledger.mark_finished("run-1", outcome(), now=3.0)
    assert synchronous() == 2
    # As sqlite ran them: five commits, all but the session's with an fsync.
    assert commits.counts() == (5, 4)


@pytest.mark.protocol("§7")
@pytest.mark.parametrize("platform", ["darwin", "linux"])
def test_on_macos_the_write_connection_asks_for_full_fsyncs(
    path: Path, platform: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # macOS's fsync() leaves the data in the drive's cache; sqlite only uses
    # F_FULLFSYNC when told to (sqlite accepts and keeps these on any platform).
    monkeypatch.setattr(ledger_schema.sys, "platform", platform)
    with Ledger.open(path) as ledger:
        assert ledger._conn is not None
        full = [int(ledger._conn.execute(f"PRAGMA {name}").fetchone()[0])
                for name in ("fullfsync", "checkpoint_fullfsync")]
    assert full == ([1, 1] if platform == "darwin" else [0, 0])


# -- pruning and sessions ------------------------------------------------------------


@pytest.mark.protocol("§7")
def test_prune_empties_only_old_reported_rows(ledger: Ledger) -> None:
    day = 86400.0
    now = 100 * day
    ledger.admit("old-reported", "lane", '{"text": "x"}', now=now - 30 * day)
    ledger.mark_reported("old-reported", "posted: 200", now=now - 8 * day)
    ledger.admit("new-reported", "lane", "{}", now=now - 30 * day)
    ledger.mark_reported("new-reported", "posted: 200", now=now - 6 * day)
    ledger.admit("old-accepted", "lane", "{}", now=now - 30 * day)
    ledger.admit("old-finished", "lane", "{}", now=now - 30 * day)
    ledger.mark_finished("old-finished", outcome(), now=now - 30 * day)

    assert ledger.prune(now) == 1
    emptied = ledger.get("old-reported")
    assert emptied is not None and emptied.body == "" and emptied.settlement is None
    for kept in ("new-reported", "old-accepted", "old-finished"):
        row = ledger.get(kept)
        assert row is not None and row.body == "{}", kept
    assert ledger.prune(now, older_than_s=5 * day) == 1
    assert ledger.get("new-reported") is not None
    assert ledger.prune(now, older_than_s=5 * day) == 0  # emptied rows are not counted again
    assert ledger.prune(now, older_than_s=0, forget_after_s=0) == 2
    assert ledger.get("old-reported") is None and ledger.get("new-reported") is None
    assert ledger.get("old-accepted") is not None and ledger.get("old-finished") is not None


@pytest.mark.protocol("§5")
def test_sessions_save_replace_and_delete_per_lane(path: Path) -> None:
    with Ledger.open(path) as ledger:
        assert ledger.account_session("conv:A", DEFAULT_ACCOUNT) is None
        ledger.save_turn("conv:A", DEFAULT_ACCOUNT, "sess-1", now=1.0)
        ledger.save_turn("conv:B", DEFAULT_ACCOUNT, "sess-9", now=1.0)
        ledger.save_turn("conv:A", DEFAULT_ACCOUNT, "sess-2", now=2.0)
        assert ledger.account_session("conv:A", DEFAULT_ACCOUNT) == "sess-2"
        assert ledger.account_session("conv:B", DEFAULT_ACCOUNT) == "sess-9"
    with Ledger.open(path) as ledger:
        assert ledger.account_session("conv:A", DEFAULT_ACCOUNT) == "sess-2"
        ledger.save_turn("conv:A", DEFAULT_ACCOUNT, None, now=3.0)
        ledger.save_turn("conv:never", DEFAULT_ACCOUNT, None, now=3.0)
        assert ledger.account_session("conv:A", DEFAULT_ACCOUNT) is None
        assert ledger.account_session("conv:B", DEFAULT_ACCOUNT) == "sess-9"


# -- refusals ------------------------------------------------------------------------


def _to_state(ledger: Ledger, run_id: str, state: RunState) -> None:
    ledger.admit(run_id, "lane", "{}", now=1.0)
    if state in (RunState.STARTED, RunState.FINISHED):
        ledger.mark_started(run_id, now=2.0)
    if state is RunState.FINISHED:
        ledger.mark_finished(run_id, outcome(), now=3.0)
    if state is RunState.REPORTED:
        ledger.mark_reported(run_id, "posted: 200", now=4.0)


@pytest.mark.protocol("§7")
@pytest.mark.parametrize(
    ("state", "move"),
    [
        (RunState.STARTED, "started"),
        (RunState.FINISHED, "started"),
        (RunState.FINISHED, "finished"),
        (RunState.REPORTED, "started"),
        (RunState.REPORTED, "finished"),
        (RunState.REPORTED, "reported"),
        (RunState.ACCEPTED, "pgid"),
        (RunState.FINISHED, "pgid"),
    ],
)
def test_moving_a_run_backwards_raises_and_changes_nothing(
    ledger: Ledger, state: RunState, move: str
) -> None:
    _to_state(ledger, "run-1", state)
    before = ledger.get("run-1")
    calls = {
        "started": partial(ledger.mark_started, "run-1", now=9.0),
        "finished": partial(ledger.mark_finished, "run-1", outcome("late"), now=9.0),
        "reported": partial(ledger.mark_reported, "run-1", "again", now=9.0),
        "pgid": partial(ledger.record_pgid, "run-1", 99),
    }
    with pytest.raises(LedgerError, match="harness bug"):
        calls[move]()
    assert ledger.get("run-1") == before
    # The failed call left no transaction open: the ledger still works.
    assert ledger.admit("run-2", "lane", "{}", now=10.0) is Admitted.NEW


@pytest.mark.protocol("§2", "§7")
@pytest.mark.parametrize("state", [RunState.ACCEPTED, RunState.STARTED, RunState.FINISHED])
def test_a_dropped_run_goes_to_reported_from_any_earlier_state(
    ledger: Ledger, state: RunState
) -> None:
    _to_state(ledger, "run-1", state)
    ledger.mark_reported("run-1", "dropped: unknown to the server", now=5.0)
    row = ledger.get("run-1")
    assert row is not None and row.state is RunState.REPORTED


def test_unknown_run_ids_raise(ledger: Ledger) -> None:
    for call in (
        partial(ledger.mark_started, "nope", now=1.0),
        partial(ledger.record_pgid, "nope", 5),
        partial(ledger.mark_finished, "nope", outcome(), now=1.0),
        partial(ledger.mark_reported, "nope", "x", now=1.0),
    ):
        with pytest.raises(LedgerError, match=r"harness bug: run 'nope' is not in the ledger"):
            call()


def test_a_closed_ledger_raises(path: Path) -> None:
    ledger = Ledger.open(path)
    ledger.close()
    ledger.close()
    with pytest.raises(LedgerError, match="closed"):
        ledger.admit("run-1", "lane", "{}", now=1.0)
    # Also a write that would not have waited for its commit.
    with pytest.raises(LedgerError, match="closed"):
        ledger.save_turn("lane", DEFAULT_ACCOUNT, "sess-1", now=1.0, durable=False)
    with pytest.raises(LedgerError, match="closed"):
        ledger.get("run-1")


def test_a_garbage_file_is_refused_by_name_and_left_alone(path: Path) -> None:
    garbage = b"this is not a ledger\n" * 300
    path.write_bytes(garbage)
    with pytest.raises(LedgerError) as caught:
        Ledger.open(path)
    message = str(caught.value)
    assert str(path) in message
    assert "move it aside" in message
    assert path.read_bytes() == garbage


def test_a_newer_schema_is_refused(path: Path) -> None:
    Ledger.open(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {ledger_module.SCHEMA_VERSION + 1}")
    with pytest.raises(LedgerError, match="newer") as caught:
        Ledger.open(path)
    assert str(path) in str(caught.value)


def test_another_sqlite_database_is_refused(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE notes (text TEXT)")
    with pytest.raises(LedgerError, match="not a prohost run ledger") as caught:
        Ledger.open(path)
    assert str(path) in str(caught.value)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 0
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == [("notes",)]


def test_a_missing_folder_is_named(tmp_path: Path) -> None:
    path = tmp_path / "absent" / "ledger.sqlite3"
    with pytest.raises(LedgerError) as caught:
        Ledger.open(path)
    assert str(path) in str(caught.value)


# --- accounts (docs/protocol.md §12) -------------------------------------------------------


@pytest.mark.protocol("§5", "§12")
def test_sessions_are_kept_per_lane_and_account(ledger: Ledger) -> None:
    ledger.save_turn("conv:C1", "work", "s-work", 1.0)
    ledger.save_turn("conv:C1", "personal", "s-personal", 2.0)
    assert ledger.lane_account("conv:C1") == "personal"
    # Back on work, the lane finds its old session there.
    assert ledger.account_session("conv:C1", "work") == "s-work"
    assert ledger.account_session("conv:C1", "personal") == "s-personal"
    assert ledger.account_session("conv:C2", "work") is None
    ledger.save_turn("conv:C1", "work", None, 3.0)
    assert ledger.account_session("conv:C1", "work") is None
    assert ledger.account_session("conv:C1", "personal") == "s-personal"
    assert ledger.lane_account("conv:C1") == "work"


@pytest.mark.protocol("§12")
def test_the_default_account_keeps_the_sessions_of_before_accounts(ledger: Ledger) -> None:
    ledger.save_turn("conv:C1", DEFAULT_ACCOUNT, "old", 1.0)
    assert ledger.account_session("conv:C1", "default") == "old"
    ledger.save_turn("conv:C1", "default", "new", 2.0)
    assert ledger.account_session("conv:C1", DEFAULT_ACCOUNT) == "new"


@pytest.mark.protocol("§12")
def test_limits_survive_a_reopen(path: Path) -> None:
    with Ledger.open(path) as first:
        first.save_account_limits({"work": 1000.0, "personal": 2000.5})
        first.save_account_limits({"work": 1500.0})
    with Ledger.open(path) as again:
        assert again.account_limits() == {"work": 1500.0}


def test_a_version_1_ledger_is_upgraded_with_its_runs_and_sessions(path: Path) -> None:
    conn = sqlite3.connect(path)
    for statement in ledger_schema._MIGRATIONS[0]:
        conn.execute(statement)
    conn.execute("INSERT INTO sessions (lane, session_id, updated_at) VALUES ('l', 's', 0)")
    conn.execute("INSERT INTO runs (run_id, lane, body, state, accepted_at) "
                 "VALUES ('r1', 'l', '{}', 'accepted', 0)")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    with Ledger.open(path) as upgraded:
        assert [row.run_id for row in upgraded.recover().pending] == ["r1"]
        assert upgraded.account_session("l", "default") == "s"
        upgraded.save_turn("l", "work", "w", 1.0)
        assert upgraded.account_limits() == {}
