"""A run resolves names where ``/etc/resolv.conf`` is a link into ``/run`` (Ubuntu's
systemd-resolved, NetworkManager, resolvconf), though its view empties ``/run``:
that one file is shown again, read-only, and nothing beside it (resolved's Unix
socket) is."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from prohost.engine.sandbox import Policy, bwrap, probe

pytestmark = pytest.mark.skipif(probe().kind != "bwrap", reason="bubblewrap cannot run here")

#: What the confined child says of each path: its text, or the errno's name.
LOOK = r"""
import errno, sys
for path in sys.argv[1:]:
    try:
        print(path, "=", open(path).read().strip())
    except OSError as error:
        print(path, "=", errno.errorcode[error.errno])
"""


@pytest.fixture
def run_folder() -> Iterator[Path]:
    """A folder in ``/run`` as systemd-resolved's ``/run/systemd/resolve``."""
    if not os.access("/run", os.W_OK):
        pytest.skip("this test may not write /run")
    folder = Path(tempfile.mkdtemp(prefix="prohost-resolve-", dir="/run"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_the_file_resolv_conf_leads_to_in_run_is_seen_and_nothing_beside_it(
        tmp_path: Path, run_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stub = run_folder / "stub-resolv.conf"
    stub.write_text("nameserver 127.0.0.53\n")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(run_folder / "io.systemd.Resolve"))
    (tmp_path / "etc").mkdir()
    # Ubuntu's relative link, from a made-up /etc beside a made-up /run: where the
    # link leads is the real /run folder above.
    (tmp_path / "run").symlink_to(run_folder.parent)
    link = tmp_path / "etc" / "resolv.conf"
    link.symlink_to(Path("..") / "run" / run_folder.name / "stub-resolv.conf")
    monkeypatch.setattr(bwrap, "RESOLVER", str(link))
    argv = bwrap.confined_command(
        Policy(), [sys.executable, "-c", LOOK, str(stub), str(run_folder / "io.systemd.Resolve"),
                   str(run_folder / "other")], network=True)
    try:
        (run_folder / "other").write_text("not the resolver's\n")
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    finally:
        listener.close()
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"{stub} = nameserver 127.0.0.53",
        f"{run_folder / 'io.systemd.Resolve'} = ENOENT",
        f"{run_folder / 'other'} = ENOENT",
    ]
