"""The run's start state in the ledger (issue 37): what its checkouts were as it
began, kept with its agent's process group in that one durable step, so that a
restart after a ``kill -9`` can say what the run changed (§7 ``changes``); and a
ledger an earlier prohost wrote (schema 3, no such column) upgraded in place, its
runs kept, without one."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from prohost.engine.ledger import Ledger, schema

pytestmark = pytest.mark.protocol("§7")


def test_the_start_state_is_kept_with_the_first_group_until_the_run_finishes(
    tmp_path: Path,
) -> None:
    with Ledger.open(tmp_path / "ledger.sqlite3") as ledger:
        ledger.admit("r1", "l", "{}", 1.0)
        ledger.mark_started("r1", 2.0)
        ledger.record_pgid("r1", 100, '{"v": 1}')
        # A fail-over's attempt: a new group, the same run begun once.
        ledger.record_pgid("r1", 200, '{"v": "later"}')
        [row] = ledger.recover().interrupted
        assert (row.pgid, row.start_state, row.started_at) == (200, '{"v": 1}', 2.0)
        ledger.mark_finished("r1", '{"ok": true}', 3.0)
        row = ledger.get("r1")
        assert row is not None and row.start_state is None


def test_a_schema_3_ledger_is_upgraded_and_its_started_run_has_no_start_state(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.sqlite3"
    conn = sqlite3.connect(path)
    for statements in schema._MIGRATIONS[:3]:
        for statement in statements:
            conn.execute(statement)
    conn.execute("INSERT INTO runs (run_id, lane, body, state, accepted_at, started_at, pgid) "
                 "VALUES ('r1', 'l', '{}', 'started', 1.0, 2.0, 4242)")
    conn.execute("PRAGMA user_version = 3")
    conn.commit()
    conn.close()
    with Ledger.open(path) as upgraded:
        [row] = upgraded.recover().interrupted
        assert (row.run_id, row.started_at, row.pgid, row.start_state) == ("r1", 2.0, 4242,
                                                                           None)
        # The upgraded file keeps a new run's start state.
        upgraded.admit("r2", "l", "{}", 3.0)
        upgraded.mark_started("r2", 4.0)
        upgraded.record_pgid("r2", 7, "{}")
        row2 = upgraded.get("r2")
        assert row2 is not None and row2.start_state == "{}"
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION == 4
