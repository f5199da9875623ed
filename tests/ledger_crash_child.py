"""Walk runs through the ledger, then die by SIGKILL without closing anything.

Used by tests/test_ledger.py: the parent reopens the ledger and checks that every
step committed here survived, and that a write left uncommitted did not. Each
committed step is printed before the next, so the parent knows what was promised.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
from pathlib import Path

from prohost.ledger import Ledger
from prohost.runs import Outcome


def main() -> None:
    path = Path(sys.argv[1])
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
