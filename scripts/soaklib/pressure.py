"""Faults of the harness's surroundings rather than its links: an account's usage
limit (docs/protocol.md §12) and a full disk under its home (§3, §7).

**Usage limits.** The harness runs with two accounts (:data:`soaklib.plan.ACCOUNTS`),
each a folder under the output folder. A limit fault writes a reset epoch into
``<folder>/limit``: until then the stand-in agent refuses every run on that account
the way Claude Code does (:mod:`soaklib.agent`); once the reset has passed the soak
removes the file (the agent already stopped refusing at the reset).

**A full disk.** ``$PROHOST_HOME`` (the ledger, status.json, the runs' folders) is
on a filesystem of its own that the soak fills and frees:

- ``tmpfs``: a small tmpfs mounted on the home for the whole soak (root only); a
  fault writes a file until the filesystem says ENOSPC, holds, and deletes it. The
  ledger then fails as it would on a real full disk, whenever sqlite needs a page
  it does not have (a WAL that must grow, a checkpoint that must grow the file).
- ``hook``: where mounting is not allowed, the harness is started through
  ``soaklib/faulty_ledger.py`` with a control file; while that file exists every
  ledger COMMIT fails with sqlite's "database or disk is full" (the ledger's
  connection class, a seam of ``prohost.engine.ledger.schema``). The fault creates
  the file, holds, and deletes it.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trio

from soaklib.plan import ACCOUNTS

#: The tmpfs under the home (big enough for a 1,000-run ledger and its WAL; the
#: fault fills whatever is free, so its size only bounds the filling).
TMPFS_SIZE = "64m"
#: The file a ``tmpfs`` fault fills the home with.
FILL_NAME = ".soak-fill"


def can_mount() -> bool:
    return os.geteuid() == 0


def _run(*argv: str) -> bool:
    return subprocess.run(list(argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          check=False).returncode == 0


def is_mountpoint(path: Path) -> bool:
    return _run("mountpoint", "-q", str(path))


@contextlib.contextmanager
def small_home(home: Path, mode: str, keep: Path) -> Iterator[str]:
    """The home on a filesystem the soak can fill; yields the mode in use (``tmpfs``
    or ``hook``). ``auto`` mounts a tmpfs where it may and falls back to the hook.
    A tmpfs is always unmounted on the way out (its content first copied to ``keep``,
    for the record), whatever ended the soak; a busy one is detached (``-l``). Only
    a kill -9 of the soak itself leaves it mounted (``umount OUT/home``)."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    mounted = False
    if mode in ("auto", "tmpfs") and can_mount() and not is_mountpoint(home):
        mounted = _run("mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0700",
                       "tmpfs", str(home))
    if mode == "tmpfs" and not mounted:
        raise RuntimeError(f"could not mount a tmpfs on {home} (not root, or mount failed); "
                           "use --disk-full hook")
    try:
        yield "tmpfs" if mounted else "hook"
    finally:
        if mounted:
            with contextlib.suppress(OSError):
                (home / FILL_NAME).unlink(missing_ok=True)
            _run("cp", "-a", f"{home}/.", str(keep))
            if not _run("umount", str(home)):
                _run("umount", "-l", str(home))
            if is_mountpoint(home):
                raise RuntimeError(f"soak bug: {home} is still a mount point; umount it")


def fill(path: Path) -> int:
    """Write ``path`` until its filesystem is full (ENOSPC); the bytes written."""
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for chunk in (1 << 20, 1 << 12):  # big steps, then the last pages
            block = b"\0" * chunk
            while True:
                try:
                    written += os.write(fd, block)
                except OSError as exc:
                    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                        raise
                    break
    finally:
        os.close(fd)
    return written


class Pressure:
    """The limit and disk faults; a mixin of :class:`soaklib.driver.Soak` (before
    :class:`soaklib.faults.Faults`, whose stubs of these methods it provides)."""

    out: Path
    home: Path
    disk_mode: str
    accounts_dir: Path

    def note(self, event: str, **details: Any) -> None:
        raise NotImplementedError

    def _need_nursery(self) -> trio.Nursery:
        raise NotImplementedError

    def account_folders(self) -> dict[str, Path]:
        return {name: self.accounts_dir / name for name in ACCOUNTS}

    def disk_control(self) -> Path:
        """The hook's control file (outside the home: it must not need the space)."""
        return self.out / "disk-full"

    async def limit(self, names: list[str], holds: list[float]) -> None:
        """Limit each account until a reset ``hold`` seconds away (whole seconds, as
        the CLI says it), and lift each limit in the background once its reset has
        passed. Cancelled: a limit written stays until the end of the soak."""
        folders = self.account_folders()
        for name, hold in zip(names, holds, strict=True):
            until = math.ceil(time.time() + hold)
            (folders[name] / "limit").write_text(f"{until}\n")
            self.note("limit_set", account=name, resets_at=until)
            self._need_nursery().start_soon(self._lift, name, until)

    async def _lift(self, name: str, until: int) -> None:
        """Remove the limit file once ``until`` has passed, unless a later fault
        wrote another reset there. Cancelled: the file stays (the soak is ending)."""
        await trio.sleep(max(0.0, until - time.time()) + 0.05)
        path = self.account_folders()[name] / "limit"
        with contextlib.suppress(OSError, ValueError):
            if int(path.read_text().split()[0]) == until:
                path.unlink()
                self.note("limit_lifted", account=name, resets_at=until)

    async def disk_full(self, hold_s: float) -> None:
        """Fill the home's filesystem (or set the hook's control file), hold, free.
        Cancelled: the disk is freed all the same (no checkpoint in between)."""
        if self.disk_mode == "tmpfs":
            written = await trio.to_thread.run_sync(fill, self.home / FILL_NAME)
            self.note("disk_filled", mode="tmpfs", bytes=written)
        else:
            self.disk_control().write_text("full\n")
            self.note("disk_filled", mode="hook")
        try:
            await trio.sleep(hold_s)
        finally:
            self.free_disk()

    def free_disk(self) -> None:
        (self.home / FILL_NAME).unlink(missing_ok=True)
        self.disk_control().unlink(missing_ok=True)
        self.note("disk_freed")
