"""scripts/bench_idle.py end to end, with a short window: both harnesses are measured
(through a real ``prohost server`` and ``prohost agent run``), the panel's run really
drew on its pseudo-terminal, and no process is left behind. No CPU figure is
asserted. Slow (its measurement windows are wall time): ``scripts/test -m slow``."""

from __future__ import annotations

import argparse

import pytest
import trio

from tests.kits.process import alive
from tests.kits.scripts import load_script

bench = load_script("bench_idle")


@pytest.mark.slow
async def test_both_harnesses_are_measured_and_the_panel_really_drew(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with trio.fail_after(120):
        figures = await bench.main_async(argparse.Namespace(seconds=1.5, warmup=0.0,
                                                            keep=False))
    assert "error" not in figures["no_panel"], figures["no_panel"]
    assert "error" not in figures["panel"], figures["panel"]
    assert figures["no_panel"]["panel"] is False and figures["panel"]["panel"] is True
    # The panel's frames reached the terminal during the window (else it is an error).
    assert figures["panel"]["terminal_bytes_per_s"] > 0
    for key in ("no_panel", "panel"):
        assert figures[key]["seconds"] >= 1.5
        assert figures[key]["cpu_pct"] >= 0 and figures[key]["heartbeats"] >= 1
    table = bench.rows(figures)
    assert [row["figure"] for row in table] == ["idle CPU, --no-panel", "idle CPU, live panel"]
    bench.print_report(figures, table)
    assert "idle CPU, live panel" in capsys.readouterr().out
    # Both harnesses were stopped on the way out.
    assert not alive(figures["no_panel"]["pid"]) and not alive(figures["panel"]["pid"])
