"""A one-shot command confined by bubblewrap (:func:`confined_command`), and the
policy's harness-owned mounts: what a real ``bwrap`` lets the command do."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from prohost.engine.sandbox import Policy, bwrap, confined_command
from tests.kits.sandbox import PROBE, Home

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


def test_overlays_are_kept_as_triples_and_resolved(tmp_path: Path) -> None:
    lower, upper, work, link = (tmp_path / name for name in ("lower", "upper", "work", "link"))
    for folder in (lower, upper, work):
        folder.mkdir()
    link.symlink_to(upper)
    policy = Policy(overlays=[(lower, link, work), (lower, tmp_path / "missing", work)])
    # A triple with a missing folder is dropped; a link is followed to where it leads.
    assert policy.resolved().overlays == ((lower, upper, work),)


@needs_bwrap
def test_an_overlay_shows_the_person_s_folder_and_keeps_the_run_s_writes(home: Home) -> None:
    """The person's agent folder seen at its own path through an overlay: its
    settings are read; what the run writes or deletes there lands in the harness's
    folder and the person's stays as it was; a later command sees those writes; a
    hidden place inside the person's folder stays hidden."""
    person = home.root / ".config" / "agent"
    (person / "secret").mkdir(parents=True)
    (person / "settings.json").write_text("the person's settings\n")
    (person / "secret" / "key").write_text("hidden\n")
    upper, work = home.prohost / "agents" / "agent", home.prohost / "work"
    for folder in (upper, work / "1", work / "2"):
        folder.mkdir(parents=True)
    policy = home.policy(hidden=[person / "secret"], writable=[upper])
    first = attrs.evolve(policy, overlays=[(person, upper, work / "1")])
    script = (f"cat {person}/settings.json; echo run > {person}/made; "
              f"echo changed > {person}/settings.json; ls {person}/secret")
    assert run(first, ["sh", "-c", script]) == "the person's settings"
    assert (person / "settings.json").read_text() == "the person's settings\n"
    assert not (person / "made").exists()
    assert (upper / "made").read_text() == "run\n"
    second = attrs.evolve(policy, overlays=[(person, upper, work / "2")])
    assert run(second, ["cat", f"{person}/made", f"{person}/settings.json"]) == "run\nchanged"
    assert probe(second, "read", person / "secret" / "key") in {"ENOENT", "EACCES"}


SHOW_OWN = """
import subprocess, sys
from prohost.engine.sandbox import Policy, bwrap
argv = [bwrap.find(), *bwrap.arguments(Policy(), tmpdir=None), "--",
        sys.executable, "-c", "import prohost, trio; print('started')"]
sys.exit(subprocess.run(argv).returncode)
"""


@needs_bwrap
def test_prohost_s_own_python_is_seen_even_where_the_view_empties_its_folder() -> None:
    """A Python kept under /tmp (a clone of prohost there, its venv in it): the
    agents of ``prohost demo`` are that Python, and every run can start it,
    though the rest of /tmp stays out of sight."""
    import shutil
    import tempfile
    import venv

    folder = Path(tempfile.mkdtemp(prefix="prohost-own-", dir="/tmp"))
    try:
        venv.EnvBuilder(with_pip=False, symlinks=True).create(folder / "venv")
        site = next((folder / "venv" / "lib").glob("python3*/site-packages"))
        # This venv finds prohost and its dependencies where the test's Python has them.
        here = [path for path in sys.path if path.endswith("site-packages")]
        (site / "own.pth").write_text("\n".join(here) + "\n")
        done = subprocess.run([str(folder / "venv" / "bin" / "python"), "-c", SHOW_OWN],
                              capture_output=True, text=True, timeout=60)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "started\n"


@needs_bwrap
def test_a_secret_store_made_after_a_run_is_hidden_from_the_next(home: Home) -> None:
    # The hidden places' resolution is kept between runs; the person's new
    # ~/.gnupg (none when the first run started) must still be hidden from the next.
    policy = home.policy()
    secret = home.root / ".gnupg" / "private-keys-v1.d" / "key"
    assert probe(policy, "read", secret) == "ENOENT"
    secret.parent.mkdir(parents=True)
    secret.write_text("PRIVATE KEY\n")
    assert probe(policy, "read", secret) in {"ENOENT", "EACCES"}
    assert probe(policy, "write", home.root / ".gnupg" / "planted") == "EROFS"


def test_a_secret_store_moved_behind_a_link_is_hidden_where_it_now_is(home: Home) -> None:
    # The person moves ~/.aws and leaves a link: the next run's view hides where
    # it leads (a link retargeted between runs is looked at again, never kept).
    policy = home.policy()
    before = bwrap.arguments(policy, tmpdir=None)
    moved = home.root / "aws-elsewhere"
    (home.root / ".aws").rename(moved)
    (home.root / ".aws").symlink_to(moved)
    after = bwrap.arguments(policy, tmpdir=None)
    assert str(moved) not in before
    assert after[after.index(str(moved)) - 1] == "--tmpfs"


@needs_bwrap
def test_a_read_grant_inside_a_hidden_place_outside_tmp_is_seen_and_only_it() -> None:
    """Where the view is the machine read-only (outside ``/tmp`` and ``/run``), a
    readable place gets no mount of its own, except inside a hidden place: an
    ``--allow-read`` of one file there shows that file, not its siblings. (Python's
    own ``json`` package stands in for a secret store outside the test's /tmp.)"""
    import json

    package = Path(json.__file__).resolve().parent
    if str(package).startswith(("/tmp/", "/run/")):
        pytest.skip("this Python is kept where the view empties its folder")
    granted, sibling = package / "__init__.py", package / "decoder.py"
    policy = Policy(readable=[granted], hidden=[package])
    assert probe(policy, "read", granted) == "ok"
    assert probe(policy, "read", sibling) in {"ENOENT", "EACCES"}
