"""What the fault matrix and its neighbours judge a run by (issue 27.9): the agents a
harness in this process spawns, counted at the spawn; the exact error a run reports
when a fault hits a never-skipped ledger step; and whether a run's processes are gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Any

import pytest
import trio

from prohost.engine.agent import process as agent_process
from prohost.engine.agent.procinfo import groups_of_run
from tests.kits.ledger import STEP_WRITES


class Spawns:
    """Every agent the harness in this process spawns, by its ``PROHOST_RUN_ID``,
    counted at the spawn itself (the ``open_process`` of
    :func:`prohost.engine.agent.process.run_agent`): an agent killed before it could
    leave its mark counts all the same (issue 27.9). The processes are kept, so a
    test can see how each ended."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._by_run: dict[str, list[Any]] = {}
        original = trio.lowlevel.open_process

        async def open_process(command: Any, **options: Any) -> trio.Process:
            proc = await original(command, **options)
            run_id = (options.get("env") or {}).get("PROHOST_RUN_ID")
            # run_agent's command line ends with the agent's shell (after bubblewrap
            # and its options where the run is confined).
            if run_id is not None and list(command[-3:-1]) == ["/bin/sh", "-c"]:
                self._by_run.setdefault(run_id, []).append(proc)
            return proc

        monkeypatch.setattr(trio.lowlevel, "open_process", open_process)
        # A confined agent whose confinement has a Landlock domain to enter is spawned
        # from a confined thread instead, not through trio's open_process: counted
        # there too.
        spawn_confined = agent_process.spawn_confined

        async def spawned_confined(confinement: Any, command: str, **options: Any) -> Any:
            proc = await spawn_confined(confinement, command, **options)
            run_id = (options.get("env") or {}).get("PROHOST_RUN_ID")
            if run_id is not None:
                self._by_run.setdefault(run_id, []).append(proc)
            return proc

        monkeypatch.setattr(agent_process, "spawn_confined", spawned_confined)

    def of(self, run_id: str) -> list[Any]:
        return list(self._by_run.get(run_id, []))


#: What the disk says, in each kind of fault (after "could not be written: ").
_DISK_SAYS = {
    "disk_full": "the run ledger $PROHOST_HOME/ledger.sqlite3 failed: database or disk is full",
    "oserror": "[Errno 28] No space left on device",
    "hang": "{what} did not finish within its bound and was abandoned (a hung or failing "
            "disk?); whether it took effect is unknown, and the next start repairs it",
}


def internal_error(step: str, kind: str) -> str:
    """The exact error a run reports when ``kind`` hits the never-skipped ``step`` (the
    ledger named as `$PROHOST_HOME/…`: §7, no local path goes to the server)."""
    write = STEP_WRITES[step]
    if (step, kind) == ("started", "hang"):
        # The bound is on the one hand-off of `started` and the session read.
        return ("internal error: StepTimedOut: " + _DISK_SAYS["hang"].format(
            what="the ledger step mark_started, or reading the lane's session"))
    says = _DISK_SAYS[kind].format(what=f"the ledger step {write}")
    return f"internal error: StepNotWritten: the ledger step {write} could not be written: {says}"


async def no_process_of_run(run_id: str, within_s: float = 5.0) -> bool:
    """Whether every process started with the run's ``PROHOST_RUN_ID`` is gone (within
    ``within_s``); those still there are killed, so none outlives the test."""
    with trio.move_on_after(within_s):
        for _ in range(10_000):  # a /proc scan, then a pause: no event says "gone"
            if not await trio.to_thread.run_sync(groups_of_run, run_id):
                return True
            await trio.sleep(0.05)
    for pgid in groups_of_run(run_id):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    return False
