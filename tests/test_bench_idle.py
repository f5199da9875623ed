"""scripts/bench_idle.py end to end, with a short window: both harnesses are measured
(through a real ``prohost server`` and ``prohost agent run``), the panel's run really
drew on its pseudo-terminal, and no process is left behind. No CPU figure is
asserted. Slow (its measurement windows are wall time): ``scripts/test -m slow``."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import trio

from tests.process_kit import alive

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_idle.py"


def load_bench() -> ModuleType:
    # The script imports bench_e2e.py (and it bench_rest.py) as its neighbours.
    sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("bench_idle", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_idle"] = module
    spec.loader.exec_module(module)
    return module


bench = load_bench()


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
