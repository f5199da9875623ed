"""Per-conversation git worktrees (§5.1), on real repositories made in tmp_path
(the git helpers are in tests/kits/repos.py)."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import trio

from prohost.engine.repos.gitcmd import GitPlaces, git_env, real_path
from prohost.engine.repos.lanemarker import LANE_MARKER
from prohost.engine.repos.worktrees import (
    RUN_REPOS_ENV,
    Checkout,
    CheckoutFailure,
    WorktreeManager,
    checkout_names,
    lane_folder_name,
)
from prohost.repospec import REPOS_USAGE, ReposFlagError, is_checkout, parse_repos
from tests.kits.repos import commit_file, git, make_repo, only, real, worktree_paths

#: No git configuration of the machine reaches this module's repositories.
pytestmark = pytest.mark.usefixtures("isolated_git")


# --- preparing ---------------------------------------------------------------------


@pytest.mark.protocol("§5")
async def test_two_lanes_get_their_own_worktrees_and_commit_independently(tmp_path: Path) -> None:
    with trio.fail_after(20):
        source = await make_repo(tmp_path / "code" / "app")
        head = (await git(source, "rev-parse", "HEAD")).strip()
        home = tmp_path / "home"
        manager = WorktreeManager(home, [source])
        assert manager.enabled
        a = await manager.prepare("conv:A")
        b = await manager.prepare("conv:B")
        assert a.failures == b.failures == ()
        wt_a, wt_b = only(a.checkouts), only(b.checkouts)
        assert wt_a != wt_b
        # Named as a person types them: the conversation's name (issue 40 point 5).
        assert a.folder == home / "worktrees" / "A" == wt_a.parent
        branch_a, branch_b = "prohost/A", "prohost/B"
        # In a repository of the conversation's own (§13), beside the worktree.
        common = real_path(wt_a.parent / ".prohost-repos" / "app.git")
        assert a.checkouts[0] == Checkout(
            name="app", path=str(wt_a), source=str(source), branch=branch_a,
            git=GitPlaces(str(wt_a), os.path.join(common, "worktrees", "app"), common))
        assert a.first == a.checkouts[0]
        assert b.checkouts[0].branch == branch_b

        commit_a = await commit_file(wt_a, "a.txt", "from A\n")
        commit_b = await commit_file(wt_b, "b.txt", "from B\n")
        assert commit_a != commit_b
        await manager.bring_back(a)  # what a run's end does
        await manager.bring_back(b)
        assert not (wt_a / "b.txt").exists() and not (wt_b / "a.txt").exists()
        # Each conversation's commit is on its own branch, in the original's refs.
        assert (await git(source, "rev-parse", branch_a)).strip() == commit_a
        assert (await git(source, "rev-parse", branch_b)).strip() == commit_b
        assert (await git(source, "rev-parse", f"{branch_a}^")).strip() == head
        # The original: same commit, same branch, no new files, nothing changed.
        assert (await git(source, "rev-parse", "HEAD")).strip() == head
        assert (await git(source, "symbolic-ref", "--short", "HEAD")).strip() == "main"
        assert (await git(source, "status", "--porcelain")) == ""
        assert sorted(await worktree_paths(source, home)) == real(source, wt_a, wt_b)
        # Registered in the conversations' repositories, not the person's.
        assert await worktree_paths(source) == real(source)


@pytest.mark.protocol("§5")
async def test_a_later_turn_finds_the_earlier_turns_work(tmp_path: Path) -> None:
    with trio.fail_after(20):
        source = await make_repo(tmp_path / "app")
        manager = WorktreeManager(tmp_path / "home", [source])
        first = only((await manager.prepare("conv:C42")).checkouts)
        await git(first, "switch", "-q", "-c", "fix-typo")
        (first / "notes.txt").write_text("half done\n")
        (first / "README").write_text("edited\n")

        # A new manager, as after a harness restart: nothing is kept in memory.
        again = WorktreeManager(tmp_path / "home", [source])
        second = only((await again.prepare("conv:C42")).checkouts)
        assert second == first
        assert (second / "notes.txt").read_text() == "half done\n"
        assert (second / "README").read_text() == "edited\n"
        assert (await git(second, "symbolic-ref", "--short", "HEAD")).strip() == "fix-typo"


@pytest.mark.protocol("§5")
async def test_a_vanished_worktree_is_made_again(tmp_path: Path) -> None:
    with trio.fail_after(20):
        source = await make_repo(tmp_path / "app")
        manager = WorktreeManager(tmp_path / "home", [source])
        path = only((await manager.prepare("conv:1")).checkouts)
        shutil.rmtree(path)  # someone tidied up by hand; git still has it registered
        again = await manager.prepare("conv:1")
        assert again.failures == ()
        assert only(again.checkouts) == path
        assert (path / "README").exists()
        assert await git(path, "status", "--porcelain") == ""
        assert sorted(await worktree_paths(source, tmp_path / "home")) == real(source, path)


@pytest.mark.protocol("§5")
async def test_a_half_made_worktree_is_made_again(tmp_path: Path) -> None:
    """What a `git worktree add` killed mid-checkout leaves: git's "initializing" lock
    and a partial tree, in a folder no prepare ever handed to an agent."""
    with trio.fail_after(20):
        source = await make_repo(tmp_path / "app", {"a": "1\n", "b": "2\n"})
        home = tmp_path / "home"
        manager = WorktreeManager(home, [source])
        # Made before the lane's first prepare, so its marker cannot vouch for it.
        path = manager.lane_folder("conv:1") / "app"
        await git(source, "worktree", "add", "--lock", "--reason", "initializing",
                  "--detach", str(path), "HEAD")
        (path / "b").unlink()
        again = only((await manager.prepare("conv:1")).checkouts)
        assert again == path
        assert (path / "b").read_text() == "2\n"
        assert await git(path, "status", "--porcelain") == ""
        assert "locked" not in await git(source, "worktree", "list", "--porcelain")
        assert sorted(await worktree_paths(source, tmp_path / "home")) == real(source, path)


@pytest.mark.protocol("§5")
async def test_a_used_worktree_is_never_taken_for_a_half_made_one(tmp_path: Path) -> None:
    with trio.fail_after(20):
        source = await make_repo(tmp_path / "app")
        manager = WorktreeManager(tmp_path / "home", [source])
        path = only((await manager.prepare("conv:1")).checkouts)
        (path / "work").write_text("mine\n")
        await git(path, "worktree", "lock", "--reason", "initializing", str(path))
        assert only((await manager.prepare("conv:1")).checkouts) == path
        assert (path / "work").read_text() == "mine\n"


@pytest.mark.protocol("§5")
async def test_a_broken_worktree_that_was_used_is_moved_aside(tmp_path: Path) -> None:
    with trio.fail_after(20):
        source = await make_repo(tmp_path / "app")
        manager = WorktreeManager(tmp_path / "home", [source])
        path = only((await manager.prepare("conv:1")).checkouts)
        (path / "work").write_text("mine\n")
        git_dir = path.parent / ".prohost-repos" / "app.git" / "worktrees" / "app"
        shutil.rmtree(git_dir)  # its bookkeeping is gone
        again = await manager.prepare("conv:1")
        assert only(again.checkouts) == path
        assert await git(path, "status", "--porcelain") == ""
        (aside,) = path.parent.glob("app.orphaned-*")
        assert (aside / "work").read_text() == "mine\n"


async def test_a_git_file_a_run_rewrote_is_put_back_and_never_followed(
    tmp_path: Path,
) -> None:
    """§13: the worktree's ``.git`` and its git dir's ``gitdir`` and ``commondir``
    are the harness's records, not what a run left there: put back, the work in
    the worktree kept."""
    with trio.fail_after(20):
        source = await make_repo(tmp_path / "app")
        manager = WorktreeManager(tmp_path / "home", [source])
        path = only((await manager.prepare("conv:1")).checkouts)
        git_dir = path.parent / ".prohost-repos" / "app.git" / "worktrees" / "app"
        made = {name: (where / name).read_bytes()
                for where, name in ((path, ".git"), (git_dir, "gitdir"), (git_dir, "commondir"))}
        (path / "work").write_text("mine\n")
        (path / ".git").unlink()
        (path / ".git").symlink_to(source / ".git")
        (git_dir / "gitdir").write_text("/nowhere/.git\n")
        (git_dir / "commondir").write_text("/elsewhere\n")
        again = await manager.prepare("conv:1")
        assert only(again.checkouts) == path
        assert not (path / ".git").is_symlink()
        assert {name: (where / name).read_bytes() for where, name in (
            (path, ".git"), (git_dir, "gitdir"), (git_dir, "commondir"))} == made
        assert await git(path, "status", "--porcelain") == "?? work\n"
        assert not list(path.parent.glob("app.orphaned-*"))


@pytest.mark.protocol("§3", "§5")
@pytest.mark.parametrize(
    "lane",
    ["../../etc", "..", ".", "a/b", "/", "conv:" + "x" * 500, "会話-ü", "", " ", "\x00\n",
     "conv:\ud800", "-", ".prohost-lane"],
)
async def test_any_lane_id_stays_inside_the_worktrees_folder(tmp_path: Path, lane: str) -> None:
    with trio.fail_after(20):
        source = await make_repo(tmp_path / "app")
        home = tmp_path / "home"
        root = (home / "worktrees").resolve()
        prepared = await WorktreeManager(home, [source]).prepare(lane)
        assert prepared.failures == ()
        path = only(prepared.checkouts).resolve()
        assert path.is_relative_to(root) and path != root
        assert prepared.folder is not None and prepared.folder.resolve().parent == root
        marker = json.loads((prepared.folder / LANE_MARKER).read_text())
        assert marker["lane"] == lane


@pytest.mark.protocol("§3", "§5")
def test_lane_folder_names() -> None:
    lanes = ["../../etc", "a/b", "a:b", "a-b", "x" * 500, "会話-ü", "", "..", "conv:C42"]
    names = [lane_folder_name(lane) for lane in lanes]
    assert len(set(names)) == len(names)  # "a/b", "a:b" and "a-b" read alike, differ in hash
    for lane, name in zip(lanes, names, strict=True):
        assert name == lane_folder_name(lane)  # stable
        assert name and "/" not in name and "." not in name and "\\" not in name
        assert name.isascii() and len(name) <= 60
    assert lane_folder_name("conv:C42").startswith("conv-C42-")


@pytest.mark.protocol("§5")
async def test_two_repos_with_one_name_get_distinct_worktrees(tmp_path: Path) -> None:
    with trio.fail_after(20):
        first = await make_repo(tmp_path / "work" / "app", {"which": "work\n"})
        second = await make_repo(tmp_path / "play" / "app", {"which": "play\n"})
        other = await make_repo(tmp_path / "lib")
        manager = WorktreeManager(tmp_path / "home", [first, second, other])
        prepared = await manager.prepare("conv:1")
        assert prepared.failures == ()
        names = [checkout.name for checkout in prepared.checkouts]
        assert len(set(names)) == 3 and names[2] == "lib"
        assert all(name.startswith("app-") for name in names[:2])
        for checkout, expected in zip(prepared.checkouts[:2], ("work\n", "play\n"), strict=True):
            assert (Path(checkout.path) / "which").read_text() == expected
        # Stable whatever the order in --repos: a lane never swaps its two apps.
        assert checkout_names([second, first]) == (names[1], names[0])


def test_names_that_differ_only_in_case_are_one_folder_on_macos(tmp_path: Path) -> None:
    names = checkout_names([tmp_path / "a" / "App", tmp_path / "b" / "app", tmp_path / ".dots"])
    assert names[0].casefold() != names[1].casefold()
    assert names[2] == "dots"


@pytest.mark.protocol("§5")
async def test_a_folder_left_by_another_repo_is_not_taken_over(tmp_path: Path) -> None:
    """--repos once named /old/app; now /new/app. The lane's "app" holds the old one's
    work: it is left alone and the new repo gets a name of its own."""
    with trio.fail_after(20):
        old = await make_repo(tmp_path / "old" / "app", {"which": "old\n"})
        new = await make_repo(tmp_path / "new" / "app", {"which": "new\n"})
        home = tmp_path / "home"
        before = only((await WorktreeManager(home, [old]).prepare("conv:1")).checkouts)
        (before / "wip").write_text("old work\n")
        after = only((await WorktreeManager(home, [new]).prepare("conv:1")).checkouts)
        assert after != before and after.parent == before.parent
        assert (after / "which").read_text() == "new\n"
        assert (before / "wip").read_text() == "old work\n"


@pytest.mark.protocol("§5")
async def test_a_checkout_that_cannot_be_prepared_does_not_stop_the_others(
    tmp_path: Path,
) -> None:
    with trio.fail_after(20):
        good = await make_repo(tmp_path / "good")
        plain = tmp_path / "plain"
        plain.mkdir()
        missing = tmp_path / "missing"
        manager = WorktreeManager(tmp_path / "home", [plain, good, missing])
        prepared = await manager.prepare("conv:1")
        assert [c.source for c in prepared.checkouts] == [str(good)]
        reasons = {failure.source: failure.reason for failure in prepared.failures}
        assert reasons[str(plain)] == "not a git checkout"
        assert reasons[str(missing)] == "no such directory"
        assert prepared.folder is not None

        only_bad = await WorktreeManager(tmp_path / "home", [plain]).prepare("conv:2")
        assert only_bad.folder is None and only_bad.checkouts == ()
        assert only_bad.failures == (CheckoutFailure(str(plain), "not a git checkout"),)


@pytest.mark.protocol("§5")
async def test_no_git_binary_is_a_failure_not_an_exception(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with trio.fail_after(20):
        source = await make_repo(tmp_path / "app")
        empty_bin = tmp_path / "bin"
        empty_bin.mkdir()
        monkeypatch.setenv("PATH", str(empty_bin))
        prepared = await WorktreeManager(tmp_path / "home", [source]).prepare("conv:1")
        assert prepared.failures == (
            CheckoutFailure(str(source), "git is not installed (no git on PATH)"),
        )


@pytest.mark.protocol("§5")
async def test_eight_lanes_at_once_on_one_repo(tmp_path: Path) -> None:
    with trio.fail_after(25):
        files = {f"f{i}.txt": f"{i}\n" for i in range(50)}
        source = await make_repo(tmp_path / "app", files)
        manager = WorktreeManager(tmp_path / "home", [source])
        results: dict[str, Path] = {}

        async def turn(lane: str) -> None:
            prepared = await manager.prepare(lane)
            assert prepared.failures == ()
            results[lane] = only(prepared.checkouts)

        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(turn, f"conv:{i}")
        assert len(set(results.values())) == 8
        for path in results.values():
            assert await git(path, "status", "--porcelain") == ""
        assert len(await worktree_paths(source, tmp_path / "home")) == 9


async def test_git_location_variables_do_not_leak_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with trio.fail_after(20):
        source = await make_repo(tmp_path / "app", {"which": "app\n"})
        decoy = await make_repo(tmp_path / "decoy", {"which": "decoy\n"})
        monkeypatch.setenv("GIT_DIR", str(decoy / ".git"))
        monkeypatch.setenv("GIT_WORK_TREE", str(decoy))
        monkeypatch.setenv("GIT_INDEX_FILE", str(decoy / ".git" / "index"))
        path = only((await WorktreeManager(tmp_path / "home", [source]).prepare("l")).checkouts)
        assert (path / "which").read_text() == "app\n"
        env = git_env({"GIT_DIR": "x", "GIT_WORK_TREE": "y", "PATH": "/bin", "GIT_SSH": "s",
                       "HOME": "/h"})
        # Nor the variables that name a program git would run (GIT_SSH), nor the
        # machine's config.
        assert env == {"PATH": "/bin", "HOME": "/h", "GIT_TERMINAL_PROMPT": "0",
                       "LC_ALL": "C", "GIT_CONFIG_NOSYSTEM": "1", "GIT_PAGER": "cat"}


async def test_the_lane_marker_says_when_it_was_last_used(tmp_path: Path) -> None:
    with trio.fail_after(20):
        source = await make_repo(tmp_path / "app")
        before = time.time()
        prepared = await WorktreeManager(tmp_path / "home", [source]).prepare("conv:9")
        assert prepared.folder is not None
        marker = json.loads((prepared.folder / LANE_MARKER).read_text())
        assert marker["lane"] == "conv:9" and before <= marker["last_used"] <= time.time()
        assert RUN_REPOS_ENV == "PROHOST_RUN_REPOS"


def test_a_manager_without_repos_is_disabled(tmp_path: Path) -> None:
    assert not WorktreeManager(tmp_path, []).enabled


# --- the --repos flag --------------------------------------------------------------


def test_parse_repos_expands_and_resolves(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path / "me")}
    cwd = tmp_path / "here"
    repos = parse_repos(
        " ~/code/app , lib, ../there/x/../y ,~, /abs/p/",
        env=env, cwd=cwd, require_checkouts=False,
    )
    assert repos == (
        tmp_path / "me" / "code" / "app",
        cwd / "lib",
        tmp_path / "there" / "y",
        tmp_path / "me",
        Path("/abs/p"),
    )


@pytest.mark.parametrize("raw", ["", "  ", ",", "a,,b", "a,", ",a", "a, ,b"])
def test_parse_repos_refuses_empty_entries(tmp_path: Path, raw: str) -> None:
    with pytest.raises(ReposFlagError) as caught:
        parse_repos(raw, env={}, cwd=tmp_path, require_checkouts=False)
    assert str(caught.value).startswith(REPOS_USAGE)
    assert "\n" not in str(caught.value)
    if not raw.strip():
        assert str(caught.value) == (
            "--repos needs a comma-separated list of git checkouts, e.g. --repos ~/code/app"
        )


async def test_parse_repos_can_require_checkouts(tmp_path: Path) -> None:
    with trio.fail_after(20):
        good = await make_repo(tmp_path / "good")
        (tmp_path / "plain").mkdir()
        assert parse_repos("good", env={}, cwd=tmp_path, require_checkouts=True) == (good,)
        # `agent run` takes a path that is not a checkout (yet); installing refuses it.
        raw = "good,plain,missing"
        assert len(parse_repos(raw, env={}, cwd=tmp_path, require_checkouts=False)) == 3
        with pytest.raises(ReposFlagError, match="plain is not a git checkout"):
            parse_repos("good,plain", env={}, cwd=tmp_path, require_checkouts=True)
        with pytest.raises(ReposFlagError, match="missing does not exist"):
            parse_repos("missing", env={}, cwd=tmp_path, require_checkouts=True)


async def test_is_checkout(tmp_path: Path) -> None:
    with trio.fail_after(20):
        source = await make_repo(tmp_path / "app")
        (tmp_path / "plain").mkdir()
        assert is_checkout(source)
        assert not is_checkout(tmp_path / "plain")
        assert not is_checkout(tmp_path / "missing")
        assert not is_checkout(source / ".git")  # inside the repo, not a work tree
        path = only((await WorktreeManager(tmp_path / "home", [source]).prepare("x")).checkouts)
        assert is_checkout(path)  # a worktree has a .git file


async def test_the_person_s_branches_resolve_in_the_worktree_as_they_are_now(
    tmp_path: Path,
) -> None:
    """The worktree is of the conversation's own repository (§13), yet ``main``
    means the person's ``main`` there, as of the turn's start; the conversation's
    own branch is never moved by it."""
    with trio.fail_after(20):
        source = await make_repo(tmp_path / "app")
        manager = WorktreeManager(tmp_path / "home", [source])
        prepared = await manager.prepare("conv:1")
        path = only(prepared.checkouts)
        mine = await commit_file(path, "mine.txt", "the agent's\n")
        assert (await git(path, "rev-parse", "main")).strip() == (
            await git(source, "rev-parse", "main")).strip()
        theirs = await commit_file(source, "theirs.txt", "the person's\n")
        again = await manager.prepare("conv:1")
        assert (await git(path, "rev-parse", "main")).strip() == theirs
        assert (await git(path, "rev-parse", "HEAD")).strip() == mine
        assert again.checkouts[0].branch == "prohost/1"


async def test_the_lane_repository_borrows_the_person_s_objects_and_nothing_else(
    tmp_path: Path,
) -> None:
    """Its alternates is in its objects folder, which its runs may write (§13): a
    rewritten one, or an ``objects/info`` made a link, is put back at the next
    turn's start."""
    with trio.fail_after(20):
        source = await make_repo(tmp_path / "app")
        elsewhere = await make_repo(tmp_path / "elsewhere")
        manager = WorktreeManager(tmp_path / "home", [source])
        path = only((await manager.prepare("conv:1")).checkouts)
        info = path.parent / ".prohost-repos" / "app.git" / "objects" / "info"
        made = (info / "alternates").read_text()
        assert made == real_path(source / ".git" / "objects") + "\n"
        (info / "alternates").write_text(str(elsewhere / ".git" / "objects") + "\n")
        await manager.prepare("conv:1")
        assert (info / "alternates").read_text() == made
        shutil.rmtree(info)
        info.symlink_to(elsewhere / ".git" / "objects" / "info")
        await manager.prepare("conv:1")
        assert not info.is_symlink() and (info / "alternates").read_text() == made
        assert not (elsewhere / ".git" / "objects" / "info" / "alternates").exists()
