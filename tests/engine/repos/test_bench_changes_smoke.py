"""scripts/bench_changes.py, tiny: every case runs, lists its files and writes no
object (the real figures come from running the script)."""

from __future__ import annotations

import argparse

import pytest
import trio

from tests.kits.scripts import load_script

pytestmark = pytest.mark.usefixtures("isolated_git")


async def test_every_case_runs_and_writes_no_object(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bench = load_script("bench_changes")
    with trio.fail_after(60):
        figures = await bench.main_async(argparse.Namespace(files=60, scale=0.002,
                                                            keep=False, repeat=2))
    assert list(figures) == ["10 changed", "20 modified", "20 untracked", "one 1 MB file"]
    assert [row["files"] for row in figures.values()] == [10, 20, 20, 1]
    assert all(row["objects_unchanged"] and row["error"] is None
               and row["truncated"] is None for row in figures.values())
    bench.print_report(figures)
    assert "one 1 MB file" in capsys.readouterr().out


async def test_a_confined_comparison_is_one_confined_process(bubblewrap_here: None) -> None:
    """Where runs are confined by bubblewrap, every git of a run's end runs in one
    confined process (``procs``), with the same files listed."""
    bench = load_script("bench_changes")
    with trio.fail_after(60):
        figures = await bench.main_async(argparse.Namespace(
            files=60, scale=0.002, keep=False, repeat=1, git="confined"))
    assert [row["files"] for row in figures.values()] == [10, 20, 20, 1]
    assert [row["processes"] for row in figures.values()] == [1, 1, 1, 1]
    assert all(row["error"] is None and row["truncated"] is None for row in figures.values())
