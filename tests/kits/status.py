"""Waits on the harness's status file (``$PROHOST_HOME/status.json``), built on the
file itself: the picture ``agent status`` reads is checked now and again each time
the harness puts a new one in place (it writes a temporary file and renames it over
the old one, which inotify reports as ``IN_MOVED_TO`` on the home folder). No
sleeping, no hook in the harness. Linux only, like the suite.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import trio

from prohost.engine.view.snapshot import Snapshot, read_snapshot

_IN_CLOSE_WRITE = 0x08
_IN_MOVED_TO = 0x80


@contextlib.contextmanager
def _watching(folder: Path) -> Iterator[int]:
    """An inotify descriptor told of every file written or moved into ``folder``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1 failed")
    try:
        if libc.inotify_add_watch(fd, os.fsencode(folder), _IN_MOVED_TO | _IN_CLOSE_WRITE) < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch failed on {folder}")
        yield fd
    finally:
        os.close(fd)


async def status_says(home: Path, predicate: Callable[[Snapshot], bool]) -> Snapshot:
    """Return the status file's picture once ``predicate`` holds for it: checked now,
    then after every new picture the harness writes. Cancelling it only stops the
    wait."""
    with _watching(home) as fd:  # watching before the first look: no write is missed
        while True:
            snapshot = read_snapshot(home)
            if snapshot is not None and predicate(snapshot):
                return snapshot
            await trio.lowlevel.wait_readable(fd)
            with contextlib.suppress(BlockingIOError):
                while os.read(fd, 4096):  # the events only say "look again"
                    pass
