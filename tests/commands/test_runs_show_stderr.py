"""``agent runs --show ID`` prints the end of the run's agent stderr, kept by the
running harness (issue 31, point 6): a real harness process, a real agent that
writes to stderr and fails, the reference server on port 0."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import trio

from prohost.engine.agent.stderrtail import tail_path
from tests.kits.harness import finished, start_run
from tests.kits.process import gated_process
from tests.kits.program import prohost


async def test_a_failed_run_s_stderr_is_kept_and_shown(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with gated_process(home) as (gate, server, _harness):
            failed = await start_run(server, gate, "work", conversation_id="C1")
            await gate.fail(failed, 3)
            await server.wait_until(finished(failed))
            shown = await prohost(home, "agent", "runs", "--show", failed, "--json")
    document = json.loads(shown.stdout)
    assert document["ok"] is False
    assert document["stderr"] is not None
    # The agent's own last line, which the error quotes too.
    last = document["stderr"].strip().splitlines()[-1]
    assert last in document["error"]
    assert stat.S_IMODE(tail_path(home, failed).stat().st_mode) == 0o600
