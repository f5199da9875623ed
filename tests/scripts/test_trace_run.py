"""scripts/trace_run.py end to end: one confined Claude run with --repos, from the
frame to the posted completion, traced with sys.setprofile (issue 39's measure).
The run completes, the path goes from the link to the report, and its
back-and-forths stay few: the slot, the lane and the settle path no longer call
back into the harness, no room calls the harness to say that something changed,
the view is handed what it shows of a finished run, the link sends the ack that
admission returns, a ledger step waits for its writer thread's event itself, and
the agent room calls nothing back into the run (it spawns, the run records the
group, it watches; what the agent printed and that it exited are state the run
reads)."""

from __future__ import annotations

from pathlib import Path

import trio

from tests.kits.scripts import load_script

trace_run = load_script("trace_run")


async def test_one_run_has_few_back_and_forths(tmp_path: Path) -> None:
    with trio.fail_after(60):
        trace = await trace_run.trace_one_run(tmp_path)
    assert trace.completion is not None and trace.completion["ok"] is True, trace.completion
    rooms = [room for room, _back in trace.path]
    assert rooms[0] == "link" and {"run", "agent", "report", "lanes"} <= set(rooms)
    found = {(caller, room) for caller, room, _function in trace.back_and_forths}
    # The triangle and the change notices of issue 39 are gone from the path.
    assert ("run", "harness") not in found and ("harness", "lanes") not in found
    assert ("harness", "link") not in found and ("view", "run") not in found
    assert ("supervisor", "link") not in found and ("blocking", "ledger") not in found
    assert ("agent", "run") not in found and ("run", "agent") not in found
    assert trace.count <= 2, trace.report()["list"]
