"""Which harnesses the reference server expects back (issue 40, point 13): those
connected until recently that did not go on purpose, measured from when they went
or, for those that went before this server started, from its start; the record
survives a restart in the state folder and a damaged one is only a lost hint."""

from __future__ import annotations

from pathlib import Path

import pytest

from prohost.server.seen import (
    EXPECTED_BACK_S,
    SEEN_FILE,
    Seen,
    expected_back,
    load_seen,
    save_seen,
)

pytestmark = pytest.mark.protocol("§11")

NOW = 1_000_000.0


def test_a_harness_is_expected_back_for_a_while_unless_it_left_or_is_here() -> None:
    seen = {
        "recent": Seen("recent", NOW - 5),
        "old": Seen("old", NOW - EXPECTED_BACK_S - 1),
        "left": Seen("left", NOW - 1, left=True),
        "here": Seen("here", NOW - 1),
    }
    assert expected_back(seen, {"here"}, NOW, started_at=NOW - 3600) == [("recent", 5.0)]


def test_one_that_was_there_when_the_server_stopped_is_expected_after_its_start() -> None:
    # The server was down for ten minutes: the harness comes back once it is up.
    seen = {"studio": Seen("studio", NOW - 600)}
    assert expected_back(seen, set(), NOW, started_at=NOW - 10) == [("studio", 600.0)]
    assert expected_back(seen, set(), NOW, started_at=NOW - EXPECTED_BACK_S) == []


def test_the_record_survives_a_restart_and_a_damaged_one_is_ignored(tmp_path: Path) -> None:
    seen = {"studio": Seen("studio", NOW, left=False), "ci": Seen("ci", NOW - 1, left=True)}
    save_seen(tmp_path, seen)
    assert load_seen(tmp_path) == seen
    (tmp_path / SEEN_FILE).write_text("{not json")
    assert load_seen(tmp_path) == {}
    assert load_seen(tmp_path / "missing") == {}
