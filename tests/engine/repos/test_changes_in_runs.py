"""What a run changed (§7 ``changes``) through the whole harness with ``--repos``:
real git, a plain agent that edits its private worktree, the reference server."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.kits.harness import agent_command, finished, running_harness, running_server
from tests.kits.repos import make_readme_repo

pytestmark = pytest.mark.protocol("§7")


async def turn(server: Any, text: str) -> dict[str, Any]:
    run_id = await server.submit_run(text, conversation_id="C1")
    await server.wait_until(finished(run_id))
    completion: dict[str, Any] = server.run(run_id).completion or {}
    return completion


async def git(path: Path, *args: str) -> str:
    done = await trio.run_process(["git", "-C", str(path), *args], capture_stdout=True)
    return done.stdout.decode()


async def test_each_turn_reports_only_what_it_changed(tmp_path: Path) -> None:
    app = await make_readme_repo(tmp_path / "code" / "app")
    await trio.Path(app / "old.txt").write_text("x\n")
    await git(app, "add", "old.txt")
    await git(app, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "o")
    lib = await make_readme_repo(tmp_path / "code" / "lib")
    base = (await git(app, "rev-parse", "HEAD")).strip()
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=agent_command("editor.py"),
            repos=(app, lib),
        ):
            first = await turn(server, "append:README.md commit create:notes/plan.md "
                                       "move:old.txt:new.txt")
            second = await turn(server, "append:notes/plan.md binary:logo.bin")

    assert first["ok"], first
    assert [entry["repo"] for entry in first["changes"]] == ["app", "lib"]
    app1 = first["changes"][0]
    # The conversation's worktrees are on its own branch, named after its folder.
    (lane_folder,) = os.listdir(tmp_path / "home" / "worktrees")
    assert (app1["branch"], app1["base"], app1["commits"], app1["more_files"]) == (
        f"prohost/{lane_folder}", base, 1, 0)
    assert app1["head"] != base
    assert app1["files"] == [
        {"path": "README.md", "change": "modified", "added": 1, "removed": 0,
         "committed": True},
        {"path": "new.txt", "change": "renamed", "from": "old.txt", "added": 0,
         "removed": 0, "committed": False},
        {"path": "notes/plan.md", "change": "added", "added": 2, "removed": 0,
         "committed": False},
    ]
    # The second turn: only its own work, from where the first left the worktree.
    app2 = second["changes"][0]
    assert (app2["base"], app2["head"], app2["commits"]) == (app1["head"], app1["head"], 0)
    assert app2["files"] == [
        {"path": "logo.bin", "change": "added", "added": None, "removed": None,
         "committed": False},
        {"path": "notes/plan.md", "change": "modified", "added": 1, "removed": 0,
         "committed": False},
    ]
    assert second["changes"][1]["repo"] == "lib"
    # The person's own checkouts are untouched.
    assert await git(app, "status", "--porcelain") == ""
    assert (await git(app, "rev-parse", "HEAD")).strip() == base


async def test_a_checkout_that_could_not_be_prepared_is_an_error_entry(tmp_path: Path) -> None:
    app = await make_readme_repo(tmp_path / "code" / "app")
    gone = await make_readme_repo(tmp_path / "code" / "gone")
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=agent_command("editor.py"),
            repos=(gone, app),
        ):
            await trio.run_process(["rm", "-rf", str(gone / ".git")])  # no longer a checkout
            done = await turn(server, "create:x.txt")
    assert [entry["repo"] for entry in done["changes"]] == ["gone", "app"]
    assert set(done["changes"][0]) == {"repo", "error"}
    assert "no private worktree" in done["changes"][0]["error"]
    assert done["changes"][1]["files"], done
    assert done["changes"][1]["files"][0]["path"] == "x.txt"


async def test_a_file_name_that_is_not_utf8_is_reported_with_u_fffd(tmp_path: Path) -> None:
    """Issue 27 point 1: the completion arrives (it once could never be encoded)."""
    app = await make_readme_repo(tmp_path / "code" / "app")
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=agent_command("editor.py"), repos=(app,),
        ):
            done = await turn(server, "badname:bad")
    assert done["ok"], done
    assert done["changes"][0]["files"] == [
        {"path": "bad\ufffd", "change": "added", "added": 1, "removed": 0,
         "committed": False}]


async def test_files_a_gitignore_edit_hides_or_uncovers_are_neither_added_nor_deleted(
    tmp_path: Path,
) -> None:
    # Issue 37 point 6: a turn that only adds gen/ to .gitignore reported every file
    # in gen/ deleted; the turn that takes it out again, added.
    app = await make_readme_repo(tmp_path / "code" / "app")
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=agent_command("editor.py"),
            repos=(app,),
        ):
            made = await turn(server, "create:gen/a.txt create:gen/sub/b.txt")
            hidden = await turn(server, "ignore:gen/")
            uncovered = await turn(server, "unignore:gen/")
    assert [f["path"] for f in made["changes"][0]["files"]] == ["gen/a.txt", "gen/sub/b.txt"]
    for done in (hidden, uncovered):
        assert [(f["path"], f["change"]) for f in done["changes"][0]["files"]] == [
            (".gitignore", "added" if done is hidden else "modified")], done["changes"]


async def test_a_committed_rename_is_reported_committed(tmp_path: Path) -> None:
    # Issue 37 point 11: a rename the run committed differs from nothing in head.
    app = await make_readme_repo(tmp_path / "code" / "app")
    await trio.Path(app / "old.txt").write_text("x\n")
    await git(app, "add", "old.txt")
    await git(app, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "o")
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=agent_command("editor.py"),
            repos=(app,),
        ):
            done = await turn(server, "move:old.txt:new.txt commit")
    assert done["changes"][0]["files"] == [
        {"path": "new.txt", "change": "renamed", "from": "old.txt", "added": 0,
         "removed": 0, "committed": True}]
