"""An ACP agent's folders as a confined run gets them (prohost.engine.run.confine,
docs/protocol.md §13): the person's seen through an overlay of the harness's,
refused where showing it would follow a link or uncover a hidden place."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from prohost.engine.run.agentfolders import (
    PersonFolderRefused,
    agent_folders,
    overlays_mount,
    remove_work_folders,
)
from prohost.engine.sandbox import Support, bwrap


def test_a_person_s_folder_that_is_a_link_is_refused(tmp_path: Path) -> None:
    user, home = tmp_path / "user", tmp_path / "home"
    (tmp_path / "elsewhere").mkdir()
    user.mkdir()
    (user / ".gemini").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(PersonFolderRefused, match="symbolic link"):
        agent_folders("gemini", {}, user, home, work=tmp_path / "work")


def test_a_person_s_folder_in_a_hidden_place_is_refused(tmp_path: Path) -> None:
    """``~/.config`` a link into a secret store: an overlay at the real path of
    ``~/.config/opencode`` would show what the store hides."""
    user, home = tmp_path / "user", tmp_path / "home"
    (user / ".ssh" / "config" / "opencode").mkdir(parents=True)
    (user / ".config").symlink_to(user / ".ssh" / "config")
    with pytest.raises(PersonFolderRefused, match="may not see"):
        agent_folders("opencode", {}, user, home, work=tmp_path / "work",
                      hidden=(user / ".ssh",))


def test_each_overlay_gets_a_fresh_private_work_folder_beside_its_upper(tmp_path: Path) -> None:
    user, home = tmp_path / "user", tmp_path / "home"
    (user / ".gemini").mkdir(parents=True)
    made = agent_folders("gemini", {}, user, home, work=tmp_path / "home" / "w")
    ((lower, upper, work),) = made.overlays
    assert (lower, upper) == (user / ".gemini",
                              home / "agents" / "gemini" / "no-lane" / ".gemini")
    assert made.writable == (upper,) and made.mounts == ()
    assert not any(work.iterdir()) and os.stat(work).st_mode & 0o077 == 0
    assert os.stat(work).st_dev == os.stat(upper).st_dev
    # overlayfs leaves its own work folder at mode 0: removed all the same.
    (work / "work").mkdir(mode=0)
    remove_work_folders(tmp_path / "home" / "w")
    assert not (tmp_path / "home" / "w").exists()
    # A work folder already there (a link a run could have planted) is never reused.
    (tmp_path / "taken" / "0").mkdir(parents=True)
    with pytest.raises(FileExistsError):
        agent_folders("gemini", {}, user, home, work=tmp_path / "taken")


def test_overlays_only_where_bubblewrap_can_mount_one(tmp_path: Path) -> None:
    """Landlock alone cannot overlay; a bubblewrap that cannot mount overlayfs (a
    kernel before 5.11) is found out once, and the runs get the harness's folders
    bound as before rather than failing."""
    home = tmp_path / "home"
    assert not overlays_mount(Support(kind="landlock", abi=7), home)
    failing = tmp_path / "bwrap"
    failing.write_text("#!/bin/sh\necho 'Can'\\''t make overlay mount' >&2\nexit 1\n")
    failing.chmod(0o755)
    assert not overlays_mount(Support(kind="bwrap", bwrap=str(failing), abi=7), home)
    # Its trial folders are gone.
    assert not any((home / "agents" / ".overlay-work").iterdir())
    real = bwrap.find()
    if real is not None:
        assert overlays_mount(Support(kind="bwrap", bwrap=real, abi=7), home)


def test_each_conversation_writes_an_upper_folder_of_its_own(tmp_path: Path) -> None:
    """Two lanes (conversations) never share the harness's folder for an agent:
    neither reads the other's sessions, and two runs at once never mount one upper
    folder twice (overlayfs leaves that undefined). A hostile lane id names no path."""
    user, home = tmp_path / "user", tmp_path / "home"
    (user / ".gemini").mkdir(parents=True)
    uppers = []
    for index, lane in enumerate(("C42", "C43", "../../../etc")):
        made = agent_folders("gemini", {}, user, home, work=tmp_path / "w" / str(index),
                             lane=lane)
        ((_lower, upper, _work),) = made.overlays
        uppers.append(upper)
    assert len(set(uppers)) == 3
    assert all(upper.parent.parent == home / "agents" / "gemini" for upper in uppers)
