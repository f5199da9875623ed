"""No text sent to the server names a local path (docs/protocol.md §7):
:func:`without_local_paths`, which the runner's internal errors go through."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from prohost.wire.outcomes import LOCAL_PATH, without_local_paths

pytestmark = pytest.mark.protocol("§7")


def test_known_places_become_their_names_the_innermost_first(tmp_path: Path) -> None:
    home = tmp_path / "home"
    repo = home / "code" / "shop"
    text = f"cannot open {repo}/x.py and {home}/ledger.sqlite3"
    assert without_local_paths(text, [(home, "$PROHOST_HOME"), (repo, "shop")]) == (
        "cannot open shop/x.py and $PROHOST_HOME/ledger.sqlite3")


def test_a_place_reached_through_a_symlink_is_written_by_name(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    said = f"git: cannot change to '{real}/wt'"
    assert without_local_paths(said, [(tmp_path / "link", "$PROHOST_HOME")]) == (
        "git: cannot change to '$PROHOST_HOME/wt'")


def test_the_users_home_is_a_tilde(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "dana"))
    assert without_local_paths(f"no {tmp_path}/dana/.config/x", []) == "no ~/.config/x"


def test_other_named_paths_become_a_placeholder(tmp_path: Path) -> None:
    exc = OSError(13, "Permission denied", "/srv/a b/c", None, os.fsencode("/opt/d"))
    assert without_local_paths(str(exc), [], [exc.filename, exc.filename2]) == (
        f"[Errno 13] Permission denied: '{LOCAL_PATH}' -> b'{LOCAL_PATH}'")  # bytes stay bytes
    # A relative one is no local path: it says nothing of the machine.
    assert without_local_paths("no notes.txt", [], ["notes.txt"]) == "no notes.txt"
