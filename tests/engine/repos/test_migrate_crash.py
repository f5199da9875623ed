"""A harness killed (SIGKILL) in the middle of moving an earlier version's
worktree (prohost/engine/repos/migrate.py): a child process prepares the lane
and is killed just after a step has done its work; the next prepare, in this
process, finishes the move with every piece of work kept.

Run as ``python -m tests.engine.repos.test_migrate_crash HOME SOURCE STEP``, the
module is that child: it says ``reached`` on its stdout once ``STEP`` has
returned, and then waits to be killed.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from prohost.engine.repos import worktrees
from tests.kits.legacy import (
    LANE,
    STEPS,
    Legacy,
    legacy_fixture,  # noqa: F401 (a fixture)
    single,
)
from tests.kits.paths import ROOT

#: No git configuration of the machine reaches this module's repositories.
pytestmark = [pytest.mark.usefixtures("isolated_git"), pytest.mark.protocol("§13")]



def _stopping_after(real: Any) -> Any:
    """``real``, then ``reached`` said and the process held until it is killed."""
    if inspect.iscoroutinefunction(real):
        async def stop_async(*args: Any) -> Any:
            await real(*args)
            print("reached", flush=True)
            await trio.sleep_forever()
        return stop_async

    def stop(*args: Any) -> Any:
        real(*args)
        print("reached", flush=True)
        threading.Event().wait()  # in a file step's thread: held until killed
    return stop


def _child(home: str, source: str, step: str) -> None:
    module = next(m for m, name in STEPS if name == step)
    setattr(module, step, _stopping_after(getattr(module, step)))
    trio.run(worktrees.WorktreeManager(Path(home), [Path(source)]).prepare, LANE)


@pytest.mark.parametrize("step", [name for _, name in STEPS])
async def test_a_harness_killed_after_any_step_leaves_what_the_next_prepare_completes(
    legacy: Legacy, step: str,
) -> None:
    with trio.fail_after(60):
        child = await trio.lowlevel.open_process(
            [sys.executable, "-m", "tests.engine.repos.test_migrate_crash",
             str(legacy.home), str(legacy.source), step],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        try:
            assert child.stdout is not None
            said = b""
            while not said.endswith(b"\n"):
                chunk = await child.stdout.receive_some(64)
                assert chunk, f"the child ended before {step} returned"
                said += chunk
            assert said == b"reached\n"
        finally:
            child.kill()  # SIGKILL: nothing of the move's own cleanup runs
            await child.wait()
        prepared = await legacy.manager().prepare(LANE)
        assert prepared.failures == ()
        assert single(prepared.checkouts).branch == legacy.branch
        await legacy.assert_moved()


if __name__ == "__main__":
    _child(*sys.argv[1:4])
