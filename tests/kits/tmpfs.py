"""A real full filesystem for the tests that need one: a small tmpfs mounted for the
test (root only; the test is skipped, saying why, where it cannot be), and a file
that fills it to its last byte."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def mounted_tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """``folder`` (made, mode 0700) with a tmpfs of ``size`` (``4m``) mounted on it,
    unmounted when the block ends whatever happened there (detached lazily when a
    failed test still holds a file open on it)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    folder.mkdir(mode=0o700, exist_ok=True)
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(folder)],
            capture_output=True, text=True, timeout=30)
    except OSError as exc:
        pytest.skip(f"no mount command here: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield folder
    finally:
        if subprocess.run(["umount", str(folder)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(folder)], check=True)


def fill(path: Path) -> None:
    """Write ``path`` until its filesystem has no byte left."""
    with open(path, "wb", buffering=0) as file:
        for size in (1 << 20, 1):
            try:
                while True:
                    file.write(b"\0" * size)
            except OSError:
                continue
