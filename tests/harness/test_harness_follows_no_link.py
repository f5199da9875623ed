"""The harness's own reads of a run's worktree follow no link the run planted
(docs/protocol.md §13: "no grant passes through a symbolic link in a place a run
may write"; issue 36).

``changes`` reads changed files in the harness's own process, unconfined, for their
content ids and line counts. A run that leaves a folder of its worktree a link to a
hidden place (``~/.ssh``) must not make those reads go there. Everything is real:
the reference server, the harness, git, the kernel's confinement; the agent is
``tests/agents/hostile_git.py``. Judged outside the run: whether the report carries
what the hidden place holds, and whether a FIFO the run left ever had a reader.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import trio

from tests.kits.full_confinement import SECTION_13_CONFINED
from tests.kits.harness import running_harness, running_server
from tests.kits.hostile_git import (
    HOSTILE,
    World,
    reply,
    turn,
    world_fixture,  # noqa: F401 (a fixture)
)
from tests.kits.repos import make_repo

pytestmark = SECTION_13_CONFINED


def had_a_reader(fifo: Path) -> bool:
    """Whether someone is holding (or blocked opening) ``fifo`` for reading: opening
    its write end without blocking fails with ``ENXIO`` when no one is. Opening it
    also lets such a reader go."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        assert exc.errno == errno.ENXIO, exc
        return False
    os.close(fd)
    return True


def secrets(world: World) -> Path:
    folder = world.user / ".ssh"
    folder.mkdir(mode=0o700)
    (folder / "id_rsa").write_text("".join(f"secret line {n}\n" for n in range(5)))
    return folder


async def test_line_counts_never_read_through_a_folder_the_run_made_a_link(
    world: World,
) -> None:
    """A first turn leaves ``src/id_rsa`` untracked; the second makes ``src`` a link
    to ``~/.ssh``. At its end the harness reads what ``src/id_rsa`` holds now: git
    says it is gone (a path beyond a link is), and so does the report, with the
    run's own line removed and none of the key's five lines counted."""
    folder = secrets(world)
    await make_repo(world.source)
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, world.home, exec_command=HOSTILE, brain="plain", env=world.env,
            repos=(world.source,),
        ):
            assert reply(await turn(server, "A", "untracked", "src", "id_rsa")) == "written"
            linked = await turn(server, "A", "link-folder", "src", str(folder))
    assert reply(linked) == "linked"
    rows = {row["path"]: row for row in linked["changes"][0]["files"]}
    assert rows["src/id_rsa"]["change"] == "deleted", rows
    assert (rows["src/id_rsa"]["added"], rows["src/id_rsa"]["removed"]) == (0, 1), rows
    assert all(row["added"] != 5 for row in rows.values()), rows


async def test_a_fifo_the_run_left_never_hangs_the_harness(world: World) -> None:
    """A first turn leaves ``src/agent.fifo`` an untracked file; the second makes it
    a FIFO that no one writes (git lists no FIFO: it is read as a file left untracked
    and now hidden). The harness never opens it, which would hang its read until the
    bound and leave a thread blocked for good, and the run's report comes whole."""
    await make_repo(world.source)
    fifo = world.worktree("B") / "src" / "agent.fifo"
    try:
        with trio.fail_after(60):
            async with running_server() as server, running_harness(
                server, world.home, exec_command=HOSTILE, brain="plain", env=world.env,
                repos=(world.source,),
            ):
                written = await turn(server, "B", "untracked", "src", "agent.fifo")
                assert reply(written) == "written"
                made = await turn(server, "B", "fifo", "src/agent.fifo")
                opened = had_a_reader(fifo)
        assert not opened, "the harness opened a FIFO the run left"
        assert reply(made) == "made"
        entry = made["changes"][0]
        assert "truncated" not in entry, entry
        assert {row["path"]: row["change"] for row in entry["files"]} == \
            {"src/agent.fifo": "deleted"}
    finally:
        if fifo.exists():
            had_a_reader(fifo)  # lets a blocked reader go, if any
