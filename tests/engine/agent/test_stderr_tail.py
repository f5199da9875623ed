"""The last 64 KiB of an agent's stderr: bounded in memory whatever is fed, kept as a
private file per run under $PROHOST_HOME/stderr, and pruned with the run's body."""

from __future__ import annotations

import hashlib
import os
import stat
import time
from pathlib import Path

from prohost.engine.agent.environment import scratch_folder
from prohost.engine.agent.output import LastLine
from prohost.engine.agent.stderrtail import (
    TAIL_BYTES,
    StderrTail,
    prune_tails,
    read_tail,
    tail_path,
    write_tail,
)
from prohost.engine.retention import KEEP_RUNS_S


def test_the_tail_keeps_the_last_bytes_whatever_the_chunks() -> None:
    tail = StderrTail(limit=10)
    for chunk in (b"abc", b"defghijklmnop", b"", b"q" * 3, b"r"):
        tail.feed(chunk)
    assert tail.data() == b"klmnopqqqr"[-10:]
    assert tail.total == 20
    big = StderrTail()
    big.feed(b"x" * (3 * TAIL_BYTES) + b"the end\n")
    assert len(big.data()) == TAIL_BYTES and big.data().endswith(b"the end\n")


def test_the_stderr_reader_feeds_the_tail_and_still_finds_the_last_line() -> None:
    reader = LastLine()
    reader.feed(b"warning: one\n" + b"noise " * 20_000 + b"\nerror: the cause\n")
    reader.close()
    assert reader.text == "error: the cause"
    assert reader.tail.data().endswith(b"\nerror: the cause\n")
    assert len(reader.tail.data()) == TAIL_BYTES


def test_a_tail_is_a_private_file_named_by_a_hash_and_pruned_after_the_body(
    tmp_path: Path,
) -> None:
    now = time.time()
    write_tail(tmp_path, "run/../../evil", b"boom\n")
    path = tail_path(tmp_path, "run/../../evil")
    assert path.parent == tmp_path / "stderr" and ".." not in path.name
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert read_tail(tmp_path, "run/../../evil") == "boom\n"
    assert read_tail(tmp_path, "never") is None
    # An empty stderr leaves no file.
    write_tail(tmp_path, "quiet", b"")
    assert read_tail(tmp_path, "quiet") is None
    # Older than a run's body is kept: a write never prunes (the folder may hold a
    # week of runs), the daily pass does (tests/engine/supervisor/test_retention.py).
    os.utime(path, (now - KEEP_RUNS_S - 1, now - KEEP_RUNS_S - 1))
    write_tail(tmp_path, "fresh", b"new\n")
    assert read_tail(tmp_path, "run/../../evil") == "boom\n"
    assert prune_tails(tmp_path, now=now) == 1
    assert read_tail(tmp_path, "run/../../evil") is None
    assert read_tail(tmp_path, "fresh") == "new\n"
    assert prune_tails(tmp_path, now=now + KEEP_RUNS_S + 2) == 1


def test_a_tail_is_named_as_its_runs_scratch_folder(
    tmp_path: Path,
) -> None:
    """One digest names both (a tail written by an earlier harness is still found:
    the name is the one it always was)."""
    for run_id in ("run_1", "run/../../evil", "a\ud800b"):
        name = tail_path(tmp_path, run_id).name
        assert name == scratch_folder(tmp_path / "runs", run_id).name + ".log"
    assert tail_path(tmp_path, "run_1").name == (
        hashlib.sha256(b"run_1").hexdigest()[:32] + ".log")
