"""A file of a worktree a run wrote, read by the harness following no link (§13).

The harness reads a run's working files itself, unconfined, to hash them for
``changes`` and to count their lines. A run may have left any folder on the way a
link to anywhere (``src`` -> ``~/.ssh``) and any file a FIFO, so
:func:`worktree_file` walks the path one folder at a time from the worktree's own
descriptor, follows no link, and opens only regular files, without waiting.
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["worktree_file", "worktree_stat"]


#: A folder of the worktree, opened without following a link (a link: ``ELOOP``).
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: A file to read: no link followed, and a FIFO opened without waiting for a writer
#: (it is then refused by its type, never read).
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _parent(where: str, name: str) -> tuple[int, str] | None:
    """Blocking: the folder holding ``name`` (a ``/``-separated path in the worktree
    ``where``), opened from the worktree's own descriptor one folder at a time,
    following no link, and the last part of ``name``; ``None`` when a folder on
    the way is gone, is no folder or is a link. The run may have left any folder a
    link to anywhere (``src`` -> ``~/.ssh``), and this process is not confined
    (§13: no read of the harness's passes through a link a run planted); git
    itself takes a path beyond a link as gone. The caller closes the descriptor."""
    *folders, last = name.split("/")
    try:
        fd = os.open(where, _FOLDER_FLAGS & ~os.O_NOFOLLOW)  # the harness's own path
    except FileNotFoundError:
        return None
    try:
        for folder in folders:
            inner = os.open(folder, _FOLDER_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = inner
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return None
        raise
    return fd, last


def worktree_file(where: str, name: str, limit: int | None = None,
             ) -> tuple[bytes | None, str | None]:
    """Blocking: the working file ``name``'s bytes as git stores them (a symlink's
    target) and its git mode, read beneath ``where`` following no link (see
    :func:`_parent`); ``(None, None)`` when it is gone, beyond a link, or neither a
    regular file, a link nor a folder (a FIFO or a device is never read);
    ``(None, "040000")`` for a folder; ``(None, mode)`` for a file larger than
    ``limit`` bytes (not read)."""
    found = _parent(where, name)
    if found is None:
        return None, None
    fd, last = found
    try:
        try:
            info = os.stat(last, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return None, None
        if stat.S_ISLNK(info.st_mode):
            return os.fsencode(os.readlink(last, dir_fd=fd)), "120000"
        if stat.S_ISDIR(info.st_mode):
            return None, "040000"
        if not stat.S_ISREG(info.st_mode):
            return None, None
        try:
            file = os.open(last, _FILE_FLAGS, dir_fd=fd)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ELOOP):
                return None, None  # replaced meanwhile
            raise
    finally:
        os.close(fd)
    with os.fdopen(file, "rb") as reading:
        info = os.fstat(reading.fileno())
        if not stat.S_ISREG(info.st_mode):
            return None, None  # replaced meanwhile by something that is not a file
        mode = "100755" if info.st_mode & stat.S_IXUSR else "100644"
        if limit is not None and info.st_size > limit:
            return None, mode
        return reading.read(), mode


def worktree_stat(where: str, name: str) -> os.stat_result | None:
    """Blocking: ``name``'s own status (a link's, not its target's) beneath
    ``where``, reached following no link (see :func:`_parent`); ``None`` when it
    is gone or beyond a link."""
    found = _parent(where, name)
    if found is None:
        return None
    fd, last = found
    try:
        return os.stat(last, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    finally:
        os.close(fd)
