"""What a run changed in a checkout (docs/protocol.md §7 ``changes``), with real git:
the state taken when the run begins, compared when it ends."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio
import trio.testing

from prohost.engine.repos import changes
from prohost.engine.repos.changes import MAX_FILES, CheckoutReader
from tests.kits.changes import by_path, compare, git, make_repo, write

pytestmark = pytest.mark.protocol("§7")










async def test_a_run_lists_what_it_changed_committed_or_not_with_line_counts(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "app", {"src/app.py": "a\nb\nc\n", "old.txt": "x\n",
                                        "gone.txt": "bye\n", "README": "hi\n"})
    before = await CheckoutReader().state("app", repo)
    write(repo / "src/app.py", "a\nB\nc\nd\n")           # modified, committed below
    git(repo, "add", "src/app.py")
    git(repo, "commit", "-q", "-m", "fix")
    write(repo / "notes/plan.md", "1\n2\n3\n")           # added, untracked
    (repo / "gone.txt").unlink()                          # deleted, uncommitted
    git(repo, "mv", "old.txt", "new.txt")                 # renamed, staged only

    entry = await compare(before)

    assert entry["repo"] == "app" and entry["branch"] == "main"
    assert entry["base"] == before.commit and entry["head"] == git(repo, "rev-parse",
                                                                   "HEAD").strip()
    assert entry["commits"] == 1 and entry["more_files"] == 0
    files = by_path(entry)
    assert list(files) == sorted(files)
    assert files["src/app.py"] == {"path": "src/app.py", "change": "modified",
                                   "added": 2, "removed": 1, "committed": True}
    assert files["notes/plan.md"] == {"path": "notes/plan.md", "change": "added",
                                      "added": 3, "removed": 0, "committed": False}
    assert files["gone.txt"] == {"path": "gone.txt", "change": "deleted", "added": 0,
                                 "removed": 1, "committed": False}
    assert files["new.txt"] == {"path": "new.txt", "change": "renamed", "from": "old.txt",
                                "added": 0, "removed": 0, "committed": False}
    assert "README" not in files


async def test_what_an_earlier_turn_left_is_not_listed_again(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "app", {"a.txt": "1\n"})
    first = await CheckoutReader().state("app", repo)
    write(repo / "left.txt", "from the first turn\n")   # uncommitted, stays
    write(repo / "a.txt", "2\n")
    assert set(by_path(await compare(first))) == {"left.txt", "a.txt"}

    second = await CheckoutReader().state("app", repo)
    write(repo / "b.txt", "the second turn's\n")
    entry = await compare(second)
    assert set(by_path(entry)) == {"b.txt"}
    assert entry["base"] == entry["head"] == first.commit and entry["commits"] == 0


async def test_the_checkout_the_agent_sees_is_untouched(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "app", {"a.txt": "1\n"})
    write(repo / "a.txt", "2\n")
    write(repo / "new.txt", "n\n")
    git(repo, "add", "a.txt")
    index = repo / ".git" / "index"
    status, staged = git(repo, "status", "--porcelain"), index.read_bytes()
    before = await CheckoutReader().state("app", repo)
    await compare(before)
    assert git(repo, "status", "--porcelain") == status
    assert index.read_bytes() == staged


async def test_binary_files_have_no_line_counts(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "app", {"img.bin": b"\0\1\2"})
    before = await CheckoutReader().state("app", repo)
    write(repo / "img.bin", b"\0\3\4\5")
    row = by_path(await compare(before))["img.bin"]
    assert (row["change"], row["added"], row["removed"]) == ("modified", None, None)


async def test_more_than_100_files_are_counted_not_listed(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "app", {"keep": "k\n"})
    before = await CheckoutReader().state("app", repo)
    for i in range(MAX_FILES + 7):
        write(repo / f"f{i:03}.txt", f"{i}\n")
    entry = await compare(before)
    files = entry["files"]
    assert isinstance(files, list) and len(files) == MAX_FILES
    assert entry["more_files"] == 7
    assert [row["path"] for row in files] == [f"f{i:03}.txt" for i in range(MAX_FILES)]


async def test_a_repository_with_no_commit_yet(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "empty")
    before = await CheckoutReader().state("empty", repo)
    assert before.error is None and before.commit is None
    write(repo / "first.txt", "hello\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "first")
    entry = await compare(before)
    assert entry["base"] is None and entry["commits"] == 1
    assert by_path(entry)["first.txt"]["committed"] is True


async def test_a_detached_head_has_no_branch(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "app", {"a.txt": "1\n"})
    git(repo, "checkout", "-q", "--detach")
    before = await CheckoutReader().state("app", repo)
    write(repo / "a.txt", "2\n")
    entry = await compare(before)
    assert entry["branch"] is None and set(by_path(entry)) == {"a.txt"}


async def test_a_checkout_that_cannot_be_read_gets_an_error_entry(tmp_path: Path) -> None:
    not_a_repo = tmp_path / "plain"
    not_a_repo.mkdir()
    before = await CheckoutReader().state("plain", not_a_repo)
    assert before.error is not None
    entry = await compare(before)
    assert set(entry) == {"repo", "error"} and entry["repo"] == "plain"
    assert "not a git repository" in str(entry["error"])

    repo = make_repo(tmp_path / "app", {"a.txt": "1\n"})
    state = await CheckoutReader().state("app", repo)
    (repo / ".git").rename(tmp_path / "moved-away")  # the worktree vanished meanwhile
    entry = await compare(state)
    assert set(entry) == {"repo", "error"}


# Issue 28: told truly, without touching the person's repository.


def objects(repo: Path) -> str:
    """What the object store holds: `git count-objects -v`, every line."""
    return git(repo, "count-objects", "-v")


async def test_a_same_size_edit_in_the_second_of_a_commit_is_seen(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "app", {"a.txt": "one\n"})
    git(repo, "config", "core.trustctime", "false")
    before = await CheckoutReader().state("app", repo)
    # The agent commits, then edits the file again within the same second: the same
    # size and times, which only git's racy-clean check (the index's own mtime is
    # that second too) tells apart. Written here as times set a minute back.
    stamp = (repo / "a.txt").stat().st_mtime_ns - 60 * 10**9
    write(repo / "a.txt", "two\n")
    os.utime(repo / "a.txt", ns=(stamp, stamp))
    git(repo, "commit", "-qam", "two")
    write(repo / "a.txt", "six\n")
    os.utime(repo / "a.txt", ns=(stamp, stamp))
    os.utime(repo / ".git" / "index", ns=(stamp, stamp))
    entry = await compare(before)
    assert by_path(entry)["a.txt"]["committed"] is False


async def test_taking_the_changes_writes_no_object_and_leaves_the_index_alone(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "app", {"a.txt": "1\n"})
    write(repo / "a.txt", "2\n")
    git(repo, "add", "a.txt")
    write(repo / "left.txt", "an earlier turn's\n")
    store, index = objects(repo), (repo / ".git" / "index").read_bytes()
    status = git(repo, "status", "--porcelain=v2", "-z")
    before = await CheckoutReader().state("app", repo)
    write(repo / "big.txt", "line\n" * 200_000)
    write(repo / "left.txt", "an earlier turn's\nand this one's\n")
    entry = await compare(before)
    assert objects(repo) == store
    assert (repo / ".git" / "index").read_bytes() == index
    files = by_path(entry)
    assert files["big.txt"]["added"] == 200_000
    assert (files["left.txt"]["added"], files["left.txt"]["removed"]) == (1, 0)
    assert set(files) == {"big.txt", "left.txt"}
    (repo / "big.txt").unlink()
    write(repo / "left.txt", "an earlier turn's\n")
    assert git(repo, "status", "--porcelain=v2", "-z") == status


async def test_an_empty_nested_repository_is_one_entry(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "app", {"a.txt": "1\n"})
    before = await CheckoutReader().state("app", repo)
    git(repo, "init", "-q", "scratch")
    write(repo / "b.txt", "b\n")
    entry = await compare(before)
    assert "error" not in entry
    assert by_path(entry)["scratch"] == {"path": "scratch", "change": "added", "added": None,
                                         "removed": None, "committed": False}
    assert set(by_path(entry)) == {"scratch", "b.txt"}


async def test_a_name_that_is_not_utf8_goes_out_with_u_fffd(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "app", {"a.txt": "1\n"})
    before = await CheckoutReader().state("app", repo)
    (repo / os.fsdecode(b"bad\xff.txt")).write_bytes(b"x\n")
    entry = await compare(before)
    assert entry["files"] == [{"path": "bad\ufffd.txt", "change": "added", "added": 1,
                               "removed": 0, "committed": False}]


@pytest.fixture
def patient_clock() -> trio.testing.MockClock:
    """A clock that jumps ahead only when nothing has happened for a while: git's
    quick commands finish in real time, a hung one meets its bound at once."""
    return trio.testing.MockClock(autojump_threshold=0.3)


async def test_a_checkout_too_slow_to_list_keeps_its_commits_and_says_why(
    tmp_path: Path, patient_clock: trio.testing.MockClock,
) -> None:
    repo = make_repo(tmp_path / "app", {"a.txt": "1\n"})
    # A clean filter (the person's own) that never answers, on a file whose times
    # changed: git status waits on it, the bound does not. (An fsmonitor hook no
    # longer runs: the harness's git turns it off.)
    hook = tmp_path / "hang.sh"
    hook.write_text("#!/bin/sh\nexec sleep 3600\n")
    hook.chmod(0o755)

    def hang() -> None:
        git(repo, "config", "filter.hang.clean", str(hook))
        (repo / ".git" / "info").mkdir(exist_ok=True)
        (repo / ".git" / "info" / "attributes").write_text("a.txt filter=hang\n")
        os.utime(repo / "a.txt", (1e9, 1e9))

    hang()
    head = git(repo, "rev-parse", "HEAD").strip()
    state = await CheckoutReader().state("app", repo, limit_s=5.0)
    assert state.error is None and state.commit == head
    entry = await compare(state, limit_s=5.0)
    assert (entry["repo"], entry["branch"], entry["base"], entry["head"], entry["commits"]) \
        == ("app", "main", head, head, 0)
    assert entry["files"] == [] and entry["more_files"] == 0
    assert entry["truncated"] == "listing its files at the start took longer than 5 s"

    git(repo, "config", "--unset", "filter.hang.clean")
    (repo / ".git" / "info" / "attributes").unlink()
    state = await CheckoutReader().state("app", repo, limit_s=5.0)
    hang()
    entry = await compare(state, limit_s=5.0)
    assert entry["head"] == head
    assert entry["truncated"] == "listing its files took longer than 5 s"


async def test_an_error_names_the_checkout_never_its_local_path(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "wt" / "app", {"a.txt": "1\n"})
    before = await CheckoutReader().state("app", repo)
    (tmp_path / "wt").rename(tmp_path / "elsewhere")  # the worktree vanished meanwhile
    entry = await compare(before)
    assert set(entry) == {"repo", "error"}
    assert str(tmp_path) not in entry["error"] and "app" in entry["error"]


def test_the_home_is_written_as_prohost_home() -> None:
    said = "could not create /srv/ph/worktrees/lane-1: No space left on device"
    assert changes.without_paths(said, "/srv/code/app", "app", home="/srv/ph") == (
        "could not create $PROHOST_HOME/worktrees/lane-1: No space left on device")
