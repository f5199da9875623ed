"""Being told when what a run's rules were made from changes: :class:`Watch` (inotify).

A confinement made ahead (issue 29's cost) must be checked at the run's start:
the same rules are right only while no folder the complement walk listed has
gained, lost or renamed an entry, and no entry a path's resolution looked up has
changed (:class:`~.cache.Stamp`). Checking that with ``stat`` calls at the run's
start costs a worker thread and a few dozen syscalls on the path between the
delivery and the spawn, where every thread competes with the run's own steps for
the interpreter. Linux's inotify says it for nothing: the harness watches those
folders from the moment the rules are checked once (after the watches exist), and
at the run's start reads the queue without blocking (:meth:`Watch.quiet`): no
event, nothing changed.

What it covers is exactly what :meth:`~.cache.Stamp.holds` looks at (its events
are a folder's entries created, deleted or moved, its attributes, and the folder
itself deleted, moved or unmounted), on a filesystem that reports every change
to inotify. A network filesystem does not report another machine's changes, so
nothing on one is watched (:func:`is_local`); then the check is made with
``stat`` calls, as without a watch. A queue that overflowed or a watch the kernel
dropped counts as a change.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Iterable, Mapping

_ATTRIB = 0x4
_MOVED_FROM = 0x40
_MOVED_TO = 0x80
_CREATE = 0x100
_DELETE = 0x200
_DELETE_SELF = 0x400
_MOVE_SELF = 0x800
_UNMOUNT = 0x2000
_Q_OVERFLOW = 0x4000
_IGNORED = 0x8000
_ONLYDIR = 0x01000000
_DONT_FOLLOW = 0x02000000
_MASK = (_ATTRIB | _MOVED_FROM | _MOVED_TO | _CREATE | _DELETE | _DELETE_SELF | _MOVE_SELF
         | _ONLYDIR | _DONT_FOLLOW)
#: Events that concern the folder as a whole, whichever entries are watched.
_WHOLE = _DELETE_SELF | _MOVE_SELF | _UNMOUNT | _Q_OVERFLOW | _IGNORED
_EVENT = struct.Struct("iIII")

#: Filesystems that do not report every change to inotify (another machine's
#: changes, a FUSE daemon's own): statfs's ``f_type`` magic numbers.
_REMOTE = frozenset({
    0x6969,  # NFS
    0x517B,  # SMB
    0xFF534D42,  # CIFS
    0xFE534D42,  # SMB2
    0x65735546,  # FUSE (sshfs, rclone, …)
    0x00C36400,  # Ceph
    0x5346414F,  # AFS
    0x6B414653,  # kAFS
    0x01021997,  # 9P (WSL2's Windows drives, VM shares)
    0x73757245,  # Coda
    0x47504653,  # GPFS
    0x0BD00BD0,  # Lustre
})

_libc = ctypes.CDLL(None, use_errno=True)
_init1 = _libc.inotify_init1
_init1.argtypes = [ctypes.c_int]
_add_watch = _libc.inotify_add_watch
_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
_statfs = _libc.statfs
_statfs.argtypes = [ctypes.c_char_p, ctypes.c_void_p]


def is_local(path: str) -> bool:
    """Whether the filesystem ``path`` is on reports every change to inotify (not a
    network or FUSE one). ``False`` when it cannot be told. Blocking."""
    buffer = ctypes.create_string_buffer(256)  # struct statfs: f_type comes first
    if _statfs(os.fsencode(path), buffer) != 0:
        return False
    kind = ctypes.c_long.from_buffer(buffer).value & 0xFFFFFFFF
    return kind not in _REMOTE


class Watch:
    """Watches on some folders: each either as a whole (any entry created, deleted
    or moved: ``None``) or for the entries it names. :meth:`quiet` says whether
    anything watched has changed since the watches were added. :meth:`close` it."""

    def __init__(self, folders: Mapping[str, Iterable[str] | None]) -> None:
        """Watch ``folders`` (real paths of existing folders). ``OSError`` when one
        cannot be watched (gone, not a folder, no inotify left): nothing is then
        watched. Blocking (one syscall per folder)."""
        fd = _init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        self._fd = fd
        self._names: dict[int, frozenset[str] | None] = {}
        self._changed = False
        try:
            for folder, names in folders.items():
                wd = _add_watch(fd, os.fsencode(folder), _MASK)
                if wd < 0:
                    error = ctypes.get_errno()
                    raise OSError(error, os.strerror(error), folder)
                self._names[wd] = None if names is None else frozenset(names)
        except BaseException:
            self.close()
            raise

    def quiet(self) -> bool:
        """Whether nothing watched has changed since the watches were added (once
        changed, always). Never blocks: it reads what the kernel has queued."""
        if self._changed or self._fd < 0:
            return False
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return True
            if self._relevant(data):
                self._changed = True
                return False

    def _relevant(self, data: bytes) -> bool:
        offset = 0
        while offset + _EVENT.size <= len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
            name = data[offset + _EVENT.size:offset + _EVENT.size + length].rstrip(b"\0")
            offset += _EVENT.size + length
            if mask & _WHOLE or wd not in self._names:
                return True
            names = self._names[wd]
            if not name:
                return True  # the folder's own attributes (its mode: who may list it)
            if names is None:
                if not mask & _ATTRIB:  # an entry's own attributes change no grant
                    return True
            elif os.fsdecode(name) in names:
                return True
        return False

    def close(self) -> None:
        """Stop watching (the kernel drops every watch with the descriptor)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
