"""One git command (repos/gitcmd.py), with real git: the reason it gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from prohost.engine.repos.gitcmd import GitError, git
from tests.kits.repos import make_repo

pytestmark = pytest.mark.usefixtures("isolated_git")


async def test_git_s_real_reason_is_kept_before_its_conclusion(tmp_path: Path) -> None:
    repo = await make_repo(tmp_path / "app")
    await git("-C", str(repo), "init", "-q", "scratch")  # no commit checked out
    with pytest.raises(GitError) as caught:
        await git("-C", str(repo), "add", "-A", "--dry-run", ".")
    assert "'scratch/' does not have a commit checked out" in str(caught.value)
    assert "fatal: adding files failed" in str(caught.value)


async def test_a_status_other_than_0_can_be_an_answer(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("1\n")
    (tmp_path / "b").write_text("2\n")
    out = await git("-C", str(tmp_path), "diff", "--no-index", "--numstat", "a", "b",
                    ok_codes=(0, 1))
    assert out.split("\t")[:2] == ["1", "1"]
