"""The harness's git inside a run's confinement (§13; :class:`ConfinedGit`): many
gits in one confined process, what the run may not see unseen by them, and a git
that outlives its bound or is cancelled ends with its whole confinement."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from prohost.engine.repos.gitcmd import GitError, GitTimedOut, git_env
from prohost.engine.repos.gitsession import PLAIN_GIT, ConfinedGit
from prohost.engine.sandbox import probe
from tests.kits.gitconfine import bwrap_confine
from tests.kits.repos import make_repo

pytestmark = [
    pytest.mark.protocol("§13"),
    pytest.mark.usefixtures("isolated_git"),
    pytest.mark.skipif(probe().kind != "bwrap", reason="no bubblewrap here"),
]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def sleeping(seconds: str) -> list[int]:
    """The processes running ``sleep <seconds>`` (Linux's /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    if cmdline.read() == f"sleep\0{seconds}\0".encode():
                        found.append(int(entry))
            except OSError:
                continue
    return found


async def test_many_gits_run_in_one_confined_process(tmp_path: Path) -> None:
    app = await make_repo(tmp_path / "app", {"a.txt": "1\n"})
    with trio.fail_after(30):
        async with ConfinedGit(bwrap_confine(), [tmp_path], tmp_path / "scratch") as run:
            head = (await run("-C", str(app), "rev-parse", "HEAD")).strip()
            assert (await run("-C", str(app), "cat-file", "-t", head)).strip() == "commit"
            assert await run("-C", str(app), "status", "--porcelain") == ""
            with pytest.raises(GitError, match="Needed a single revision"):
                await run("-C", str(app), "rev-parse", "--verify", "nothing-such")
            assert (await run("-C", str(app), "rev-parse", "HEAD")).strip() == head
            assert run.started == 1
    assert (await PLAIN_GIT("-C", str(app), "rev-parse", "HEAD")).strip() == head


async def test_what_a_run_may_not_see_its_git_does_not_either(tmp_path: Path) -> None:
    secrets = tmp_path / "home" / ".ssh"
    secrets.mkdir(parents=True)
    (secrets / "id_rsa").write_text("PRIVATE KEY\n")
    where = str(secrets / "id_rsa")
    assert (await PLAIN_GIT("hash-object", where)).strip()  # readable outside
    with trio.fail_after(30):
        async with ConfinedGit(bwrap_confine(hidden=(secrets,)), [tmp_path],
                               tmp_path / "scratch") as run:
            with pytest.raises(GitError):
                await run("hash-object", where)


async def test_a_git_past_its_bound_ends_with_its_confinement(tmp_path: Path) -> None:
    app = await make_repo(tmp_path / "app")
    env = git_env()
    with trio.fail_after(30):
        async with ConfinedGit(bwrap_confine(), [tmp_path], tmp_path / "scratch") as run:
            await run("-C", str(app), "rev-parse", "HEAD")
            process = run._process  # the confinement's leader (bubblewrap)
            assert process is not None
            with pytest.raises(GitTimedOut, match=r"took longer than 0\.5 s"):
                await run("-C", str(app), "-c", "alias.wait=!sleep 61.25", "wait", env=env,
                          timeout_s=0.5)
            assert not alive(process.pid)
            assert sleeping("61.25") == []  # what the git started is gone too
            # The next git starts a new confinement.
            await run("-C", str(app), "rev-parse", "HEAD")
            assert run.started == 2


async def test_a_cancelled_git_ends_with_its_confinement(tmp_path: Path) -> None:
    app = await make_repo(tmp_path / "app")
    with trio.fail_after(30):
        async with ConfinedGit(bwrap_confine(), [tmp_path], tmp_path / "scratch") as run:
            await run("-C", str(app), "rev-parse", "HEAD")
            process = run._process
            assert process is not None
            with trio.move_on_after(0.5):
                await run("-C", str(app), "-c", "alias.wait=!sleep 62.25", "wait")
            assert not alive(process.pid)
            assert sleeping("62.25") == []
            assert run._process is None
    assert list((tmp_path / "scratch").iterdir()) == []  # its folder removed
