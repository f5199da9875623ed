"""New (untracked) files in a run's §7 ``changes``, with real git: read only where
their content can matter (a rename, a file left by an earlier turn or in the base
commit), and counted as git counts a file added or deleted whole."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from prohost.engine.repos import changes
from prohost.engine.repos.changes import CheckoutReader
from tests.kits.changes import by_path, compare, git, make_repo, write

pytestmark = pytest.mark.protocol("§7")


def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The working files changes.py reads whole from now on (by base name)."""
    seen: list[str] = []
    real = changes.worktree_file

    def counting(where: str, name: str,
                 limit: int | None = None) -> tuple[bytes | None, str | None]:
        data, mode = real(where, name, limit)
        if data is not None:
            seen.append(Path(name).name)
        return data, mode

    monkeypatch.setattr(changes, "worktree_file", counting)
    return seen


async def test_new_files_are_read_once_for_their_counts_not_to_be_told_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    repo = make_repo(tmp_path / "app", {"a.txt": "1\n"})
    before = await CheckoutReader().state("app", repo)
    for i in range(changes.MAX_FILES + 5):
        write(repo / "new" / f"n{i:03}.txt", f"{i}\n")
    seen = reads(monkeypatch)
    entry = await compare(before)
    assert entry["more_files"] == 5
    # Only the 100 listed ones, for their line counts: nothing is gone, so none of
    # them can be a rename, and none was there before.
    assert sorted(seen) == [f"n{i:03}.txt" for i in range(changes.MAX_FILES)]
    assert all(row["added"] == 1 and row["removed"] == 0 for row in entry["files"])


async def test_a_file_moved_without_git_is_a_rename(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "app", {"old.txt": "x\ny\n", "b.txt": "b\n"})
    before = await CheckoutReader().state("app", repo)
    (repo / "old.txt").rename(repo / "moved.txt")  # old deleted, moved untracked
    write(repo / "other.txt", "o\n")
    files = by_path(await compare(before))
    assert files["moved.txt"]["change"] == "renamed" and files["moved.txt"]["from"] == "old.txt"
    assert files["other.txt"]["change"] == "added" and "old.txt" not in files


async def test_an_untracked_file_left_by_an_earlier_turn_is_listed_only_if_changed(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "app", {"a.txt": "1\n"})
    write(repo / "same.txt", "left\n")
    write(repo / "edited.txt", "left\n")
    before = await CheckoutReader().state("app", repo)
    write(repo / "same.txt", "left\n")  # written again, same bytes
    write(repo / "edited.txt", "left\nand more\n")
    files = by_path(await compare(before))
    assert set(files) == {"edited.txt"}
    assert (files["edited.txt"]["change"], files["edited.txt"]["added"],
            files["edited.txt"]["removed"]) == ("modified", 1, 0)


async def test_a_file_committed_away_and_back_untracked_unchanged_is_not_listed(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "app", {"a.txt": "1\n", "keep.txt": "k\n"})
    before = await CheckoutReader().state("app", repo)
    git(repo, "rm", "-q", "keep.txt")
    git(repo, "commit", "-q", "-m", "drop keep")
    write(repo / "keep.txt", "k\n")  # back, untracked, the same bytes
    entry = await compare(before)
    assert entry["commits"] == 1 and by_path(entry) == {}


def numstat(repo: Path, old: Path | str, new: Path | str) -> tuple[int | None, int | None]:
    out = subprocess.run(["git", "-C", str(repo), "diff", "--no-index", "--numstat",
                          str(old), str(new)], capture_output=True, text=True).stdout
    added, removed, _ = out.split("\t", 2)
    return (None if added == "-" else int(added), None if removed == "-" else int(removed))


CONTENTS: dict[str, bytes] = {
    "lines.txt": b"a\nb\nc\n",
    "no_newline.txt": b"a\nb",
    "one_line": b"just this",
    "blank_lines.txt": b"\n\n\n",
    "binary.bin": b"\x89PNG\0\1\2",
    "late_nul.txt": b"x\n" * 4100 + b"\0",  # the NUL past git's first 8,000 bytes
}


async def test_files_added_or_deleted_whole_are_counted_as_git_counts_them(
    tmp_path: Path,
) -> None:
    aside = tmp_path / "aside"
    for name, data in CONTENTS.items():
        write(aside / name, data)
    # Deleted (the same contents, once tracked) and added (in another checkout: in
    # this one they would be renames), each against git's own numstat.
    gone = make_repo(tmp_path / "gone", {name: data for name, data in CONTENTS.items()})
    added = make_repo(tmp_path / "added", {"a.txt": "1\n"})
    before_gone = await CheckoutReader().state("gone", gone)
    before_added = await CheckoutReader().state("added", added)
    for name, data in CONTENTS.items():
        (gone / name).unlink()
        write(added / name, data)
    deleted = by_path(await compare(before_gone))
    new = by_path(await compare(before_added))
    for name in CONTENTS:
        expected = numstat(tmp_path, "/dev/null", aside / name)
        assert (new[name]["added"], new[name]["removed"]) == expected, name
        assert (deleted[name]["removed"], deleted[name]["added"]) == expected, name


async def test_a_new_file_too_large_to_count_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(changes, "COUNT_FILE_BYTES", 100)
    repo = make_repo(tmp_path / "app", {"a.txt": "1\n"})
    before = await CheckoutReader().state("app", repo)
    write(repo / "big.txt", "a line\n" * 100)
    seen = reads(monkeypatch)
    row = by_path(await compare(before))["big.txt"]
    assert (row["change"], row["added"], row["removed"]) == ("added", None, None)
    assert seen == []
