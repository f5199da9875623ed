"""Fixtures of the sandbox room's tests: a made-up home, and a confined child."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kits.sandbox import Confiner, Home


@pytest.fixture
def home(tmp_path: Path) -> Home:
    root = tmp_path / "home"
    for folder in (".ssh", ".aws", ".config/gh", "src", "work", "original",
                   ".local/share/prohost/worktrees/lane-a", ".cache"):
        (root / folder).mkdir(parents=True)
    (root / ".ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
    (root / ".ssh" / "known_hosts").write_text("example.com ssh-ed25519 AAAA\n")
    (root / ".aws" / "credentials").write_text("[default]\n")
    (root / ".config" / "gh" / "hosts.yml").write_text("token: x\n")
    (root / ".local" / "share" / "prohost" / "credentials.json").write_text("{}\n")
    (root / "notes.txt").write_text("a note\n")
    (root / "src" / "readme").write_text("readable\n")
    (root / "original" / "file").write_text("original\n")
    prohost = root / ".local" / "share" / "prohost"
    return Home(root=root, work=root / "work", original=root / "original", prohost=prohost,
                worktree=prohost / "worktrees" / "lane-a")


@pytest.fixture
def confine() -> Confiner:
    """A :class:`Confiner`: the Landlock fallback's rules."""
    return Confiner()
