"""A one-shot command confined by bubblewrap (:func:`confined_command`), and the
policy's harness-owned mounts: what a real ``bwrap`` lets the command do."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from prohost.engine.sandbox import Policy, bwrap, confined_command

from .conftest import PROBE, Home

needs_bwrap = pytest.mark.skipif(bwrap.find() is None, reason="no bubblewrap here")


def run(policy: Policy, argv: list[str], **options: bool) -> str:
    done = subprocess.run(confined_command(policy, argv, **options), capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def probe(policy: Policy, op: str, path: Path) -> str:
    return run(policy, [sys.executable, "-I", "-S", "-c", PROBE, op, str(path)])


def test_mounts_are_kept_as_pairs_and_resolved(tmp_path: Path) -> None:
    source, link = tmp_path / "own-cache", tmp_path / "link"
    source.mkdir()
    link.symlink_to(source)
    policy = Policy(mounts=[(link, tmp_path / "home" / ".cache"),
                            (tmp_path / "missing", tmp_path / "x")])
    assert policy.mounts == ((link, tmp_path / "home" / ".cache"),
                             (tmp_path / "missing", tmp_path / "x"))
    # A source that does not exist is dropped; a link is followed to where it leads.
    assert policy.resolved().mounts == ((source, tmp_path / "home" / ".cache"),)


@needs_bwrap
def test_a_mount_shows_the_harness_folder_at_its_target(home: Home) -> None:
    own = home.prohost / "cache"
    own.mkdir()
    (home.root / ".cache" / "person").write_text("the person's\n")
    policy = home.policy(mounts=[(own, home.root / ".cache")])
    listed = run(policy, ["sh", "-c", f"ls {home.root}/.cache; echo new > {home.root}/.cache/made",
                          ])
    assert "person" not in listed
    assert (own / "made").read_text() == "new\n"
    assert not (home.root / ".cache" / "made").exists()


@needs_bwrap
def test_the_command_reads_and_writes_only_its_places(home: Home) -> None:
    policy = home.policy()
    assert probe(policy, "write", home.work / "new") == "ok"
    assert probe(policy, "read", home.root / ".ssh" / "id_ed25519") in {"ENOENT", "EACCES"}
    assert probe(policy, "read", home.prohost / "credentials.json") in {"ENOENT", "EACCES"}
    assert probe(policy, "write", home.original / "file") == "EROFS"
    assert probe(policy, "read", home.original / "file") == "ok"
    # A hidden folder is empty and read-only: a write there is refused, not lost.
    assert probe(policy, "write", home.prohost / "planted") == "EROFS"
    assert probe(policy, "write", home.root / ".ssh" / "authorized_keys") == "EROFS"


@needs_bwrap
def test_without_network_no_abstract_socket_is_reachable(home: Home) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = f"\0prohost-test-{os.getpid()}"
    listener.bind(name)
    listener.listen()
    listener.setblocking(False)
    try:
        connect = ("import socket,sys\ns=socket.socket(socket.AF_UNIX)\n"
                   "try:\n s.connect(\"\\0\" + sys.argv[1]); print(\"connected\")\n"
                   "except OSError as e: print(e.errno)")
        said = run(home.policy(), [sys.executable, "-I", "-S", "-c", connect, name[1:]])
        assert said in {str(errno.ECONNREFUSED), str(errno.EPERM)}
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()
