"""Die by SIGKILL at a chosen point of the ledger's life, without closing anything.

``ledger_crash_child.py PATH`` walks several runs through every state, printing
each committed step before the next, then dies with a write left uncommitted: the
parent (tests/engine/ledger/test_sqlite_ledger.py) reopens the ledger and checks that every step
committed here survived, and the uncommitted one did not.

``ledger_crash_child.py harness STEP WHEN ARGS...`` is the production harness
(``python -m prohost ARGS...``, the runner's real steps) on a ledger that kills
this process just ``before`` the transaction holding STEP's write begins, or just
``after`` it committed (tests/kits/ledger.py ``FaultyLedger``). Used by the kill -9
cells of tests/engine/ledger/test_fault_matrix.py.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
from pathlib import Path

from prohost.engine.accounts.book import DEFAULT_ACCOUNT

# Run as a script (tests/kits/ledger_crash_child.py): the tree's root must be importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from prohost.engine.ledger import Ledger
from prohost.wire.runs import Outcome


def harness(step: str, when: str, args: list[str]) -> int:
    import prohost.commands.agent as agent_command
    from prohost.cli import main as cli_main
    from tests.kits.ledger import STEP_WRITES, Fault, FaultyLedger

    FaultyLedger.fault = Fault(STEP_WRITES[step], f"kill_{when}")
    # The CLI opens the ledger by this name; everything else is the production code.
    agent_command.Ledger = FaultyLedger  # type: ignore[misc]
    return cli_main(args)


def main() -> None:
    if sys.argv[1] == "harness":
        sys.exit(harness(sys.argv[2], sys.argv[3], sys.argv[4:]))
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
    ledger.save_turn("conv:0", DEFAULT_ACCOUNT, "sess-1", now=114.0)
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
