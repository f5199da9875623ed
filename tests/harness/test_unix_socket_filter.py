"""The seccomp filter on Unix sockets wherever a run's code runs (docs/protocol.md
§13: a run may not connect to a Unix socket outside its places; issue 36, attack 6).

A socket of the person's in a readable place of the home (an editor's, a tmux
server's) is reachable by path through a read-only view; only the filter that
refuses ``socket(AF_UNIX)`` keeps a run off it. Two places had none: a run
confined by Landlock alone (no bubblewrap), and the harness's own git confined
by bubblewrap, which runs what a run planted (a submodule's clean filter).
Everything is real: the reference server, the harness, the kernel; judged by
whether the person's listener ever accepted a connection.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
import trio

from prohost.engine.sandbox import seccomp
from tests.kits.confinement import accepted_any, listening
from tests.kits.full_confinement import SECTION_13_CONFINED
from tests.kits.harness import finished, running_harness, running_server
from tests.kits.hostile_git import HOSTILE, reply, turn
from tests.kits.hostile_git import World as GitWorld
from tests.kits.no_sandbox import without_bubblewrap
from tests.kits.paths import AGENTS
from tests.kits.repos import isolate_git, make_repo

pytestmark = [
    *SECTION_13_CONFINED,
    pytest.mark.skipif(seccomp.program() is None,
                       reason=f"no seccomp filter for {seccomp.machine()}"),
]




@pytest.fixture(name="world")
def world_fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> GitWorld:
    isolate_git(tmp_path, monkeypatch)
    return GitWorld(tmp_path)


async def test_landlock_alone_keeps_a_run_off_a_socket_in_a_readable_place(
    world: GitWorld, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without bubblewrap (Landlock alone) a run connects to no Unix socket in a
    folder of the home it may read, and the status no longer says it can."""
    without_bubblewrap(monkeypatch)
    (world.user / "work").mkdir()
    editor = listening(world.user / "work" / "server")
    tool = shlex.join([sys.executable, str(AGENTS / "attacker.py"),
                       f"connect:{world.user / 'work' / 'server'}"])
    try:
        with trio.fail_after(60):
            async with running_server() as server, running_harness(
                server, world.home, exec_command=tool, brain="plain", env=world.env,
            ) as running:
                run_id = await server.submit_run("attack", conversation_id="A")
                await server.wait_until(finished(run_id))
                completion = server.run(run_id).completion
                said = running.harness.snapshot().confinement
        assert completion is not None and completion["ok"] is True, completion
        assert not accepted_any(editor), "a Landlock-only run reached a socket of the home"
        assert said is not None and "Landlock" in said, said
        assert "Unix sockets" not in said, said
    finally:
        editor.close()


async def test_the_harness_s_confined_git_runs_a_planted_filter_off_sockets(
    world: GitWorld,
) -> None:
    """A run stages a submodule whose config names a clean filter that connects to
    a socket of the person's in the home: the harness's own git, which runs that
    filter inside the run's confinement at the run's end, reaches no socket."""
    await make_repo(world.source)
    (world.user / "work").mkdir()
    editor = listening(world.user / "work" / "server")
    try:
        with trio.fail_after(60):
            async with running_server() as server, running_harness(
                server, world.home, exec_command=HOSTILE, brain="plain", env=world.env,
                repos=(world.source,),
            ):
                planted = await turn(server, "A", "submodule-connect",
                                     str(world.user / "work" / "server"))
        assert reply(planted) == "planted"
        assert [row["path"] for row in planted["changes"][0]["files"]] == [".clean", "sub"]
        assert not accepted_any(editor), "the harness's confined git reached a socket"
    finally:
        editor.close()
