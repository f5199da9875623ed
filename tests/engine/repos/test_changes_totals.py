"""Issue 28 point 5: what the totals cover, and submodules (docs/protocol.md §7
``changes``), with real git for the submodules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from prohost.engine.repos import changes
from prohost.engine.repos.changes import CheckoutReader
from prohost.engine.repos.gitsession import PLAIN_GIT, ConfinedGit, Git
from prohost.engine.view.reporttext import changes_summary, files_line
from prohost.wire.protocol import converter
from tests.kits.repos import git, make_repo

pytestmark = [pytest.mark.protocol("§7"), pytest.mark.usefixtures("isolated_git")]


def entry_of(n_listed: int, more: int) -> dict[str, Any]:
    return {"repo": "app", "branch": "main", "commits": 0, "more_files": more,
            "files": [{"path": f"f{i}", "change": "added", "added": 2, "removed": 0,
                       "committed": False} for i in range(n_listed)]}


def test_the_totals_say_which_files_their_lines_cover() -> None:
    whole = [entry_of(100, 150)]
    assert changes_summary(whole) == "250 files (+200 −0 in the 100 listed)"
    assert files_line(whole[0]) == "app: 250 files (+200 −0 in the 100 listed)"
    assert changes_summary([entry_of(3, 0)]) == "3 files (+6 −0)"


def test_a_list_cut_short_says_so() -> None:
    entry = {**entry_of(0, 0), "commits": 2,
             "truncated": "listing its files took longer than 5 s"}
    assert files_line(entry) == ("app: files not listed, 2 commits on main "
                                 "(listing its files took longer than 5 s)")


async def with_submodule(tmp_path: Path) -> tuple[Path, Path]:
    lib = await make_repo(tmp_path / "lib", {"lib.txt": "1\n"})
    app = await make_repo(tmp_path / "app", {"a.txt": "1\n"})
    await git(app, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib),
              "lib")
    await git(app, "commit", "-qm", "lib")
    return app, app / "lib"


async def compare(before: changes.CheckoutState, run: Git = PLAIN_GIT) -> dict[str, Any]:
    entry: dict[str, Any] = converter.unstructure(
        await changes.CheckoutReader(run=run).compare(before))
    return entry


async def test_a_submodule_pointer_change_has_no_line_counts(tmp_path: Path) -> None:
    app, lib = await with_submodule(tmp_path)
    before = await CheckoutReader().state("app", app)
    (lib / "lib.txt").write_text("2\n")
    await git(lib, "commit", "-qam", "two")
    entry = await compare(before)
    assert entry["files"] == [{"path": "lib", "change": "modified", "added": None,
                               "removed": None, "committed": False}]


async def test_a_dirty_submodule_is_listed_as_modified(tmp_path: Path,
                                                      confined_git: ConfinedGit) -> None:
    # Read by a git inside the run's confinement (§13): a submodule's own status
    # runs there, with the run's rights only.
    app, lib = await with_submodule(tmp_path)
    before = await CheckoutReader(run=confined_git).state("app", app)
    (lib / "lib.txt").write_text("dirty\n")
    entry = await compare(before, confined_git)
    assert entry["files"] == [{"path": "lib", "change": "modified", "added": None,
                               "removed": None, "committed": False}]


async def test_a_submodule_with_only_an_untracked_file_is_listed_as_modified(
    tmp_path: Path, confined_git: ConfinedGit,
) -> None:
    # Issue 37 point 11: status says "U" (untracked content) for it, not "M".
    app, lib = await with_submodule(tmp_path)
    before = await CheckoutReader(run=confined_git).state("app", app)
    (lib / "new.txt").write_text("new\n")
    entry = await compare(before, confined_git)
    assert entry["files"] == [{"path": "lib", "change": "modified", "added": None,
                               "removed": None, "committed": False}]
