"""Walk runs through the ledger, then die by SIGKILL without closing anything.

Used by tests/test_ledger.py: the parent reopens the ledger and checks that every
step committed here survived, and that a write left uncommitted did not. Each
committed step is printed before the next, so the parent knows what was promised.

``ledger_crash_child.py PATH`` walks several runs through every state;
``ledger_crash_child.py PATH steps N`` takes one run through the first ``N`` steps
of a run's life exactly as prohost.engine.runner writes them (durable or not) and dies
right after the ``N``-th returned.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path

from prohost.engine.ledger import Ledger
from prohost.wire.runs import Outcome

#: A run's steps in prohost.engine.runner's order, with the durability the runner asks for.
RUN_STEPS: list[tuple[str, Callable[[Ledger], None]]] = [
    ("accepted", lambda ledger: ledger.admit("run-x", "conv:X", '{"run_id": "run-x"}',
                                             now=100.0) and None),
    ("started", lambda ledger: ledger.mark_started("run-x", now=101.0)),
    ("pgid", lambda ledger: ledger.record_pgid("run-x", 4242, durable=False)),
    ("session", lambda ledger: ledger.save_session("conv:X", "sess-x", now=102.0,
                                                   durable=False)),
    ("finished", lambda ledger: ledger.mark_finished(
        "run-x", Outcome(ok=True, reply="done").to_json(), now=103.0)),
    ("reported", lambda ledger: ledger.mark_reported("run-x", "delivered: 200", now=104.0,
                                                     durable=False)),
]


def walk_steps(path: Path, count: int) -> None:
    ledger = Ledger.open(path)
    for name, write in RUN_STEPS[:count]:
        write(ledger)
        print(name, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    path = Path(sys.argv[1])
    if sys.argv[2:3] == ["steps"]:
        walk_steps(path, int(sys.argv[3]))
        return
    ledger = Ledger.open(path)

    def step(text: str) -> None:
        print(text, flush=True)

    for index, run_id in enumerate(["run-c", "run-a", "run-b", "run-d", "run-e"]):
        ledger.admit(run_id, f"conv:{index}", f'{{"run_id": "{run_id}"}}', now=100.0 + index)
        step(f"admit {run_id}")
    ledger.mark_started("run-a", now=110.0)
    step("started run-a")
    ledger.record_pgid("run-a", 4242)
    step("pgid run-a")
    ledger.mark_started("run-b", now=111.0)
    ledger.mark_finished("run-b", Outcome(ok=True, reply="done").to_json(), now=112.0)
    step("finished run-b")
    ledger.mark_reported("run-e", "dropped", now=113.0)
    step("reported run-e")
    ledger.save_session("conv:0", "sess-1", now=114.0)
    step("session conv:0")

    # A write in flight when the process dies must vanish whole.
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    other.execute(
        "INSERT INTO runs (run_id, lane, body, state, accepted_at) "
        "VALUES ('run-uncommitted', 'x', '{}', 'accepted', 0)"
    )
    step("uncommitted")
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
