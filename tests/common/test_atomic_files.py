"""Atomic file replacement: which writes fsync and which do not (issue 11)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from prohost.engine.view.snapshot import STATUS_FILE, read_snapshot, write_snapshot
from prohost.files import write_atomically
from prohost.home import Credentials, load_credentials, save_credentials
from tests.kits.panel import busy_snapshot


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every fsync made during the test (each still really made)."""
    made: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        made.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    return made


def test_the_status_file_is_replaced_whole_without_an_fsync(
    tmp_path: Path, fsyncs: list[int]
) -> None:
    snapshot = busy_snapshot()
    for _ in range(3):  # once a second while runs execute
        write_snapshot(tmp_path, snapshot)
    assert fsyncs == []
    assert read_snapshot(tmp_path) == snapshot
    assert stat.S_IMODE((tmp_path / STATUS_FILE).stat().st_mode) == 0o600
    # No temporary file is left beside it.
    assert [path.name for path in tmp_path.iterdir()] == [STATUS_FILE]


@pytest.mark.protocol("§10")
def test_credentials_are_fsynced_with_their_folder(tmp_path: Path, fsyncs: list[int]) -> None:
    creds = Credentials(token="t0ken", secret="s3cret", ws_url="ws://127.0.0.1:1/ws")
    path = save_credentials(tmp_path, creds)
    assert len(fsyncs) == 2  # the file, then the folder that holds the rename
    assert load_credentials(tmp_path) == creds
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_durable_write_is_the_default(tmp_path: Path, fsyncs: list[int]) -> None:
    write_atomically(tmp_path / "unit", b"[Unit]\n", 0o644)
    assert len(fsyncs) == 2
    write_atomically(tmp_path / "unit", b"[Unit]\nDescription=x\n", 0o644, durable=False)
    assert len(fsyncs) == 2
    assert (tmp_path / "unit").read_bytes() == b"[Unit]\nDescription=x\n"
    assert stat.S_IMODE((tmp_path / "unit").stat().st_mode) == 0o644
