"""Terminal output that never blocks: log lines and the panel on stdout/stderr.

Logging and rich write synchronously from the trio thread. When the reader of
stdout/stderr stops reading (a stalled SSH session, a pipe into a pager left
open, a full pipe nobody drains), an ordinary blocking ``write`` would freeze the
whole event loop: no acks, no pongs, no heartbeats, and the server would soon
take the harness for dead. :class:`NonBlockingOutput` writes through a *separate*
non-blocking open of the same pipe or terminal (so the flags of the file that the
shell and other processes share are left alone), keeps what did not fit in a
small backlog, and drops output beyond that, saying how much once the reader
catches up. Output to regular files is written as usual (it cannot stall that
way); a socket (journald's stdout) is written with ``MSG_DONTWAIT``.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import socket
import stat
import threading
from typing import TextIO, cast

#: Bytes kept waiting for a slow reader before new output is dropped.
BACKLOG_LIMIT_BYTES = 64 * 1024
#: Said once the reader is back, with the number of bytes lost.
DROPPED_NOTE = "[prohost: {} bytes of output dropped: the terminal was not reading]\n"


def nonblocking(target: TextIO) -> TextIO:
    """``target`` (stdout, stderr) as a :class:`NonBlockingOutput`."""
    return cast(TextIO, NonBlockingOutput(target))


class NonBlockingOutput(io.TextIOBase):
    """A text stream over ``target`` whose writes never block; see the module
    docstring. Thread-safe."""

    def __init__(self, target: TextIO) -> None:
        super().__init__()
        self._target = target
        self._encoding = getattr(target, "encoding", None) or "utf-8"
        self._lock = threading.Lock()
        self._backlog = bytearray()
        self.dropped = 0
        self._fd: int | None = None
        self._socket: socket.socket | None = None
        with contextlib.suppress(OSError, ValueError, AttributeError):
            self._open(target.fileno())

    def _open(self, fd: int) -> None:
        mode = os.fstat(fd).st_mode
        if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
            # A new open file description of the same pipe or terminal: O_NONBLOCK
            # on it does not change the one the shell (or a parent) shares with us.
            self._fd = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK
                               | os.O_CLOEXEC | os.O_NOCTTY)
        elif stat.S_ISSOCK(mode):
            self._socket = socket.socket(fileno=os.dup(fd))

    # -- the stream interface

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._encoding

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if self._fd is None and self._socket is None:
            return self._target.write(text)  # a regular file: writes do not stall
        data = text.encode(self._encoding, "replace")
        with self._lock:
            self._pump()
            if self._backlog or not self._send(data):
                if len(self._backlog) + len(data) <= BACKLOG_LIMIT_BYTES:
                    self._backlog += data
                else:
                    self.dropped += len(data)
        return len(text)

    def flush(self) -> None:
        if self._fd is None and self._socket is None:
            self._target.flush()
            return
        with self._lock:
            self._pump()

    def isatty(self) -> bool:
        return self._target.isatty()

    def fileno(self) -> int:
        return self._target.fileno()

    def close(self) -> None:
        """Write what fits now (never waiting), then let go of the extra open."""
        with self._lock:
            self._pump()
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            if self._socket is not None:
                self._socket.close()  # our dup only
                self._socket = None
        super().close()

    # -- internals (the lock held)

    def _pump(self) -> None:
        """Send as much of the backlog as the reader takes, then the dropped note."""
        if self._backlog:
            sent = self._send_some(bytes(self._backlog))
            del self._backlog[:sent]
        if not self._backlog and self.dropped:
            note = DROPPED_NOTE.format(self.dropped).encode()
            if self._send(note):
                self.dropped = 0

    def _send(self, data: bytes) -> bool:
        """Send all of ``data`` now, or keep the unsent rest in the backlog. False
        if nothing at all could be sent."""
        sent = self._send_some(data)
        if sent == 0 and data:
            return False
        rest = data[sent:]
        room = max(0, BACKLOG_LIMIT_BYTES - len(self._backlog))
        self._backlog += rest[:room]
        self.dropped += len(rest) - len(rest[:room])
        return True

    def _send_some(self, data: bytes) -> int:
        total = 0
        while total < len(data):
            try:
                if self._socket is not None:
                    count = self._socket.send(data[total:], socket.MSG_DONTWAIT)
                elif self._fd is not None:
                    count = os.write(self._fd, data[total:])
                else:
                    return total
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                # The reader is gone (EPIPE, EIO on a hung-up terminal): drop it all.
                self.dropped += len(data) - total
                return len(data)
            if count <= 0:
                break
            total += count
        return total
