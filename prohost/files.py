"""Replacing a file so that a reader, or a crash, never sees half of it."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def write_atomically(path: Path, data: bytes, mode: int = 0o600, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data``, mode exactly ``mode``.

    The temporary file is created 0600 (so there is no moment when another user
    could open a secret), written, fsync'd, given ``mode``, renamed over ``path``,
    and the directory fsync'd so the rename survives a crash. A reader sees the
    old file or the new one, never half of either. The parent folder must exist.

    ``durable=False`` skips both fsyncs, for a file rewritten often whose loss in a
    crash of the machine is harmless (``status.json``): readers still never see
    half of it, but after a power loss it may be the old file, or empty.
    Credentials and service units keep the default.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            os.fchmod(fd, mode)  # exactly `mode`, whatever the umask
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if not durable:
        return
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
