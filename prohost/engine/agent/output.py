"""What the harness keeps of an agent's output, in bounded memory.

Two pure readers, fed the chunks :mod:`prohost.engine.agent.process` reads from the
pipes: :class:`LineSplitter` cuts stdout into lines for a streaming brain and
drops (and counts) a line too long to hold; :class:`LastLine` remembers the last
non-empty stderr line, where a failing CLI says what went wrong. Neither ever
holds more than its bound, whatever the agent prints.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from prohost.engine.agent.stderrtail import StderrTail

# The process runner's name: a dropped line is part of watching the agent.
log = logging.getLogger("prohost.agentproc")

#: A stderr line is kept up to this many bytes (the start of it, where an error
#: message says what went wrong) and reported up to ``STDERR_LINE_CHARS`` characters.
STDERR_LINE_BYTES = 2048
#: How much of a dropped over-long stdout line its reader is shown.
HEAD_BYTES = 64 * 1024
STDERR_LINE_CHARS = 500


class LineSplitter:
    """Cuts stdout into ``\\n``-separated lines, holding at most ``limit`` bytes of one.

    Each complete line goes to ``emit`` without its ``\\n``; a line longer than
    ``limit`` is never buffered whole: it is dropped, counted in ``dropped``, and
    logged once; ``overlong``, when given, then gets its first :data:`HEAD_BYTES`
    (an ACP agent's request too long to read must still be answered: its id and
    method are at its start).
    """

    def __init__(self, emit: Callable[[bytes], None], limit: int,
                 overlong: Callable[[bytes], None] | None = None) -> None:
        self._emit = emit
        self._limit = limit
        self._on_overlong = overlong
        self._buf = bytearray()
        self._overlong = False
        self._head = b""
        #: Lines skipped for being longer than ``limit`` bytes.
        self.dropped = 0

    def feed(self, chunk: bytes | bytearray) -> None:
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                self._append(chunk, start, len(chunk))
                return
            self._append(chunk, start, end)
            self._finish()
            start = end + 1

    def close(self) -> None:
        """End of stream: a last line without its ``\\n`` still counts."""
        if self._buf or self._overlong:
            self._finish()

    def _append(self, chunk: bytes | bytearray, start: int, end: int) -> None:
        if self._overlong or start == end:
            return
        if len(self._buf) + (end - start) > self._limit:
            if self._on_overlong is not None:
                more = max(0, min(end - start, HEAD_BYTES - len(self._buf)))
                self._head = bytes(self._buf[:HEAD_BYTES]) + bytes(chunk[start:start + more])
            # A fresh buffer, not clear(): the point is to give the memory back.
            self._buf = bytearray()
            self._overlong = True
            return
        self._buf += memoryview(chunk)[start:end]

    def _finish(self) -> None:
        if self._overlong:
            self._overlong = False
            self.dropped += 1
            log.warning("an agent printed a line over %d bytes; it was skipped", self._limit)
            head, self._head = self._head, b""
            if self._on_overlong is not None:
                self._on_overlong(head)
            return
        line = bytes(self._buf)
        self._buf = bytearray()
        self._emit(line)


class LastLine:
    """Remembers the last non-empty line of a stream, keeping a bounded start of it."""

    def __init__(self) -> None:
        self._current = bytearray()
        self._last = b""
        #: The stream's last 64 KiB, for ``agent runs --show`` (kept with the run by
        #: :func:`prohost.engine.agent.stderrtail.write_tail`).
        self.tail = StderrTail()

    def feed(self, chunk: bytes | bytearray) -> None:
        self.tail.feed(chunk)
        parts = bytes(chunk).split(b"\n")
        self._extend(parts[0])
        if len(parts) == 1:
            return
        self._settle(bytes(self._current))
        for line in reversed(parts[1:-1]):
            if line.strip():
                self._last = line[:STDERR_LINE_BYTES]
                break
        self._current = bytearray(parts[-1][:STDERR_LINE_BYTES])

    def close(self) -> None:
        """End of stream: a last line without its ``\\n`` still counts."""
        self._settle(bytes(self._current))
        self._current = bytearray()

    @property
    def text(self) -> str:
        """The last non-empty line, decoded, stripped, at most ``STDERR_LINE_CHARS`` long."""
        return self._last.decode("utf-8", errors="replace").strip()[:STDERR_LINE_CHARS]

    def _extend(self, piece: bytes) -> None:
        room = STDERR_LINE_BYTES - len(self._current)
        if room > 0:
            self._current += piece[:room]

    def _settle(self, line: bytes) -> None:
        if line.strip():
            self._last = line
