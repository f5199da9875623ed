"""A hostile agent attacks the harness through git (issue 36, attacks 1, 2, 4, 5;
docs/protocol.md §13: the harness never trusts what a run could write, and the
person's repository changes only by the conversation's own branch).

Everything is real: the reference server, the harness, git, the kernel's
Landlock. The agent is ``tests/agents/hostile_git.py``; each turn's text says
which attack it makes. Each test is judged by what happened outside the run:
marker files a planted program would write, the person's files and repository.
"""

from __future__ import annotations

import pytest
import trio

from prohost.commands.gc import gc_command
from prohost.engine.repos.collect import collect_garbage
from tests.kits.full_confinement import SECTION_13_CONFINED
from tests.kits.harness import running_harness, running_server
from tests.kits.hostile_git import (
    DENIED_WRITE,
    HOSTILE,
    World,
    reply,
    turn,
    world_fixture,  # noqa: F401 (a fixture)
)
from tests.kits.no_sandbox import without_bubblewrap
from tests.kits.repos import make_repo

pytestmark = SECTION_13_CONFINED

DENIED_READ = {"EACCES", "ENOENT"}










async def test_a_planted_git_dir_s_fsmonitor_never_runs(world: World) -> None:
    """Attack 1: ``.git`` names a git dir of the run's whose config sets
    ``core.fsmonitor``: the harness's git reads ``changes`` at the run's end, the
    next run's state at its start and ``agent gc`` judges the worktree, and the
    planted program runs at none of them."""
    await make_repo(world.source)
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, world.home, exec_command=HOSTILE, brain="plain", env=world.env,
            repos=(world.source,),
        ):
            assert reply(await turn(server, "A", "fsmonitor", str(world.marker))) == "planted"
            assert not world.marker.exists(), "the run's end ran the planted program"
            # Planted again, so that gc finds it too.
            second = await turn(server, "A", "fsmonitor", str(world.marker))
            assert reply(second) == "planted"
            assert not world.marker.exists(), "the next run's start ran the planted program"
    await collect_garbage(world.home, older_than_s=0, dry_run=False, force=False)
    await collect_garbage(world.home, older_than_s=0, dry_run=False, force=True)
    assert not world.marker.exists(), "agent gc ran the planted program"


async def test_a_git_linked_to_the_original_grants_nothing_of_it(world: World) -> None:
    """Attack 2, first half: ``.git`` made a symlink to the original's ``.git``.
    The next run cannot write the original's hooks or config, and the next new
    conversation's ``git worktree add`` runs no planted hook."""
    await make_repo(world.source)
    before = world.original_git_files()
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, world.home, exec_command=HOSTILE, brain="plain", env=world.env,
            repos=(world.source,),
        ):
            assert reply(await turn(server, "A", "link-git", str(world.source))) == "linked"
            planted = await turn(server, "A", "plant-hook", str(world.source),
                                 str(world.marker))
            assert reply(planted) in DENIED_WRITE
            await turn(server, "C", "nothing")  # a new conversation: a worktree add
    assert world.original_git_files() == before
    assert not world.marker.exists()
    assert (world.worktree("A") / ".git").is_file()


async def test_a_git_dir_named_with_a_trailing_space_grants_nothing_more(
    world: World,
) -> None:
    """Attack 2, second half: ``gitdir: <wt>/.g `` (git keeps the space) beside
    ``.g``, a link to a folder holding ``$PROHOST_HOME``: the next run reads no
    credentials, writes nothing of the original, and its completion says
    confined truthfully."""
    await make_repo(world.source)
    readme = (world.source / "README").read_bytes()
    credentials = world.home / "credentials.json"
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, world.home, exec_command=HOSTILE, brain="plain", env=world.env,
            repos=(world.source,),
        ):
            assert reply(await turn(server, "A", "space-git", str(world.tmp))) == "spaced"
            read = await turn(server, "A", "read", str(credentials))
            wrote = await turn(server, "A", "write", str(world.source / "README"))
            token = credentials.read_text()
    assert reply(read) in DENIED_READ
    assert token not in read["reply"]
    assert reply(wrote) in DENIED_WRITE
    assert (world.source / "README").read_bytes() == readme
    assert read["confined"] is True and wrote["confined"] is True


async def test_the_harness_appends_to_no_reflog_a_run_linked(world: World) -> None:
    """Attack 4: the run detaches, deletes its branch and leaves the branch's
    reflog a link to the original's config and its HEAD log a link to
    ``~/.bashrc``; the next turn (whose harness puts the worktree on its branch
    again) appends to neither, and the original stays sound (``git fsck``)."""
    await make_repo(world.source)
    config = (world.source / ".git" / "config").read_bytes()
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, world.home, exec_command=HOSTILE, brain="plain", env=world.env,
            repos=(world.source,),
        ):
            linked = await turn(server, "A", "reflog", str(world.source), str(world.bashrc))
            assert reply(linked) == "linked"
            assert reply(await turn(server, "A", "nothing")) == "nothing"
    assert world.bashrc.read_text() == "export EDITOR=vi\n"
    assert (world.source / ".git" / "config").read_bytes() == config
    world.git("fsck", "--no-progress")
    world.git("config", "--list")  # "bad config line" if anything was appended


async def test_a_run_changes_nothing_of_the_person_s_repository_but_its_branch(
    world: World,
) -> None:
    """Attack 5: one run overwrites the loose object of ``main:Makefile``, looks
    for a third conversation's staged-only secret and moves another
    conversation's branch. The original's content, the secret and the branch
    are as they were."""
    await make_repo(world.source, {"Makefile": "all:\n\techo hello\n"})
    makefile = world.git("show", "main:Makefile")
    secret = "staged-only-secret-4f1c"
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, world.home, exec_command=HOSTILE, brain="plain", env=world.env,
            repos=(world.source,),
        ):
            assert reply(await turn(server, "S", "stage", secret)) == "staged"
            other = world.git("rev-parse", world.branch("S")).strip()
            assert reply(await turn(server, "H", "object")) in DENIED_WRITE
            hunted = await turn(server, "H", "hunt", secret)
            await turn(server, "H", "move", world.branch("S"))
    assert world.git("show", "main:Makefile") == makefile
    assert reply(hunted) == "not found"
    assert world.git("rev-parse", world.branch("S")).strip() == other


async def test_the_conversation_s_commits_come_back_on_its_branch_only(world: World) -> None:
    """§13: the person's repository changes by the conversation's branch alone. A
    run's commit is on ``prohost/<lane folder>`` in the person's repository once
    the run has ended (brought back by the harness), the objects it holds are
    sound (``git fsck``), and nothing else of the person's moved."""
    await make_repo(world.source)
    refs = world.git("for-each-ref", "--format=%(refname) %(objectname)")
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, world.home, exec_command=HOSTILE, brain="plain", env=world.env,
            repos=(world.source,),
        ):
            commit = reply(await turn(server, "A", "commit", "done"))
    assert world.git("rev-parse", world.branch("A")).strip() == commit
    assert world.git("show", f"{world.branch('A')}:work.txt") == "done\n"
    world.git("fsck", "--no-progress", "--strict")
    after = world.git("for-each-ref", "--format=%(refname) %(objectname)")
    assert sorted(set(after.splitlines()) - set(refs.splitlines())) == [
        f"refs/heads/{world.branch('A')} {commit}"]


async def test_a_planted_submodule_s_filter_runs_only_confined(world: World) -> None:
    """§13: the harness reads a submodule's own changes (its ``git status``, with
    the config and filters of a repository the run planted) only inside the run's
    confinement. The run stages ``sub`` whose config names a clean filter writing
    a marker outside the run: ``changes`` lists ``sub``, and neither the run's end
    nor the next run's start nor ``agent gc`` wrote the marker."""
    await make_repo(world.source)
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, world.home, exec_command=HOSTILE, brain="plain", env=world.env,
            repos=(world.source,),
        ):
            planted = await turn(server, "A", "submodule", str(world.marker))
            assert reply(planted) == "planted"
            assert not world.marker.exists(), "the run's end ran the planted filter unconfined"
            assert [row["path"] for row in planted["changes"][0]["files"]] == [".clean", "sub"]
            assert reply(await turn(server, "A", "nothing")) == "nothing"
            assert not world.marker.exists(), "the next run's start ran the filter unconfined"
    await collect_garbage(world.home, older_than_s=0, dry_run=False, force=False)
    assert not world.marker.exists(), "agent gc ran the planted filter"


@pytest.mark.parametrize("bubblewrap", [True, False], ids=["bubblewrap", "landlock-only"])
async def test_a_worktree_config_a_run_wrote_takes_no_effect_outside(
    world: World, bubblewrap: bool, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The person's repository enables ``extensions.worktreeConfig``, and the
    conversation's worktree is one an earlier version made (a worktree of the
    person's repository, whose git dir its runs may write). A run writes its git
    dir's ``config.worktree``, naming a clean filter for every file: no git of
    the harness's outside a confinement runs it (the run's end, the next run's
    start and its branch moves, ``agent gc``), and the person's repository stays
    sound. Without bubblewrap (Landlock alone) the harness's git is not
    confined: it does not read that checkout at the run's end (its ``changes``
    entry says why), and gc keeps it unread."""
    if not bubblewrap:
        without_bubblewrap(monkeypatch)
    await make_repo(world.source)
    world.git("config", "extensions.worktreeConfig", "true")
    path = world.worktree("A")
    path.parent.mkdir(parents=True)
    world.git("worktree", "add", "--detach", str(path), "HEAD")
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, world.home, exec_command=HOSTILE, brain="plain", env=world.env,
            repos=(world.source,),
        ):
            planted = await turn(server, "A", "worktree-config", str(world.marker))
            assert reply(planted) == "planted"
            assert not world.marker.exists(), "the run's end ran the planted filter"
            if not bubblewrap:
                assert "config.worktree" in planted["changes"][0]["error"]
            second = await turn(server, "A", "nothing")
            assert reply(second) == "nothing"
            assert not world.marker.exists(), "the next run's start ran the planted filter"
            # Removed before that start: the checkout is read again.
            assert "error" not in second["changes"][0], second["changes"]
            again = await turn(server, "A", "worktree-config", str(world.marker))
            assert reply(again) == "planted"
    await collect_garbage(world.home, older_than_s=0, dry_run=True, force=False)
    await collect_garbage(world.home, older_than_s=0, dry_run=False, force=False)
    assert not world.marker.exists(), "gc ran the planted filter unconfined"
    if bubblewrap:
        # `agent gc`'s own way: its git inside a confinement like a run's.
        capsys.readouterr()
        assert await gc_command(world.home, 0, dry_run=False, force=False) == 0
        assert not world.marker.exists(), "agent gc ran the planted filter"
        said = capsys.readouterr().out
        # Confined, it reads the worktree (and keeps it for its untracked files).
        assert "uncommitted changes" in said and "outside a confinement" not in said, said
    assert world.worktree("A").exists()  # its untracked files are work: kept
    world.git("fsck", "--no-progress")
