"""``prohost agent run`` on a home whose disk cannot take a write: one clear line and
exit 1, never a traceback (found by the soak, issue 16: a harness started while its
home's tmpfs was full died in ``InstanceLock.acquire`` with ENOSPC).

The harness is the real command in a subprocess; the full disk is a real one:
``/dev/full`` (every write fails ENOSPC) behind the lock file, and, where the tests
may mount (root), a tmpfs filled to the last byte.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from prohost.home import LOCK_FILE, Credentials, save_credentials
from tests.kits.paths import ROOT


def pair(home: Path) -> None:
    """Credentials for a server nobody needs to run: the harness must stop before
    it connects."""
    save_credentials(home, Credentials(token="t" * 20, secret="s" * 20,
                                       ws_url="ws://127.0.0.1:9/v1/agent/ws"))


def start(home: Path) -> subprocess.CompletedProcess[str]:
    """``prohost agent run`` on ``home``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROHOST_")}
    env["PROHOST_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "prohost", "agent", "run", "--exec", "true", "--no-panel"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


def fill(path: Path) -> None:
    """Write ``path`` until its filesystem has no byte left."""
    with open(path, "wb", buffering=0) as file:
        for size in (1 << 20, 1):
            try:
                while True:
                    file.write(b"\0" * size)
            except OSError:
                continue


@pytest.fixture
def full_tmpfs(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; the /dev/full case covers the rest")
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(home)],
                   check=True)
    try:
        yield home
    finally:
        subprocess.run(["umount", str(home)], check=True)
        assert not home.is_mount()


def check_refused(result: subprocess.CompletedProcess[str], home: Path) -> None:
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert f"prohost: cannot set up its home {home}" in result.stderr, result.stderr
    assert "is the disk full or read-only?" in result.stderr


def test_a_lock_file_that_cannot_be_written_is_one_line_and_exit_1(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    pair(home)
    (home / LOCK_FILE).symlink_to("/dev/full")
    check_refused(start(home), home)


def test_a_full_home_is_one_line_and_exit_1(full_tmpfs: Path) -> None:
    pair(full_tmpfs)
    fill(full_tmpfs / "filler")
    check_refused(start(full_tmpfs), full_tmpfs)
