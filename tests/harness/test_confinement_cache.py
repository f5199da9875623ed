"""A harness keeps what its runs' rules share (issue 29), and gives it up at exit.

Real parts as in ``test_confinement.py``: the reference server, the harness, the
kernel's Landlock; the agent is ``tests/agents/prober.py`` as the plain brain.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from prohost.engine.sandbox import SIMULATE_ABSENT_ENV, probe
from tests.harness.test_confinement import World, prober, results, turn
from tests.kits.harness import running_harness, running_server
from tests.kits.repos import isolate_git

pytestmark = pytest.mark.skipif(
    probe().kind != "landlock",
    reason=f"this system cannot confine with Landlock: {probe().reason}")


async def test_runs_share_kept_rules_see_a_later_file_and_the_harness_closes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    isolate_git(tmp_path, monkeypatch)
    monkeypatch.delenv(SIMULATE_ABSENT_ENV, raising=False)
    world = World(tmp_path)
    later = world.user / "later.txt"
    tool = prober(f"read:later:{later}", f"read:ssh_key:{world.user / '.ssh' / 'id_ed25519'}")
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, world.home, exec_command=tool, brain="plain", env=world.env,
        ) as running:
            first = results(await turn(server, "A"))
            later.write_text("made between two runs\n")
            second = results(await turn(server, "A"))
            rules = running.harness.sandbox.support.rules
            assert rules is not None and rules.held > 0
    assert first["later"] != "ok"
    assert second["later"] == "ok"
    assert first["ssh_key"] != "ok" and second["ssh_key"] != "ok"
    assert rules.held == 0  # closed at the harness's exit
