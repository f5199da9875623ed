"""The last 64 KiB of each run's agent stderr, kept for ``prohost agent runs --show``.

Kept as one file per run in ``$PROHOST_HOME/stderr/`` rather than in the ledger: the
ledger's writes are group commits fsync'd on every run's path (``mark_finished``
is durable, §7), and 64 KiB more per run there would be up to 16 more pages written
and fsync'd in that commit, and a WAL that grows with every chatty agent. Stderr is
for a person looking into a run afterwards, so losing it with the machine is
harmless: the file is written once, when the run's process has ended, without an
fsync and off the ledger's writer thread.

It is pruned with the run: a tail is removed once its run's body would be
(:data:`~prohost.engine.retention.KEEP_RUNS_S`), by the harness's daily pass
(:mod:`prohost.engine.retention` owns the period and the schedule), so the folder
holds about a week of runs. Never at a run's write: a busy harness keeps tens of
thousands of tails, and listing them all would cost that run a scan of the folder.

File names are a hash of the run id, the per-run scratch folders' own
(:func:`~prohost.engine.agent.environment.run_digest`): a run id is the server's
text and must never become a path.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from prohost.engine.agent.environment import run_digest
from prohost.engine.retention import KEEP_RUNS_S

#: How much of a run's stderr is kept: its end, where a failing CLI says why.
TAIL_BYTES = 64 * 1024
TAIL_DIR = "stderr"


class StderrTail:
    """The last :data:`TAIL_BYTES` of a stream, in bounded memory, whatever is fed."""

    def __init__(self, limit: int = TAIL_BYTES) -> None:
        self._limit = limit
        self._buf = bytearray()
        #: Bytes fed in all (more than kept when the start was dropped).
        self.total = 0

    def feed(self, chunk: bytes | bytearray) -> None:
        self.total += len(chunk)
        self._buf += chunk[-self._limit:]
        excess = len(self._buf) - self._limit
        if excess > 0:
            del self._buf[:excess]

    def data(self) -> bytes:
        return bytes(self._buf)


def tail_path(home: Path, run_id: str) -> Path:
    return home / TAIL_DIR / f"{run_digest(run_id)}.log"


def write_tail(home: Path, run_id: str, data: bytes) -> None:
    """Keep ``data`` (the tail) as ``run_id``'s stderr. Blocking file work (run it in
    a thread); raises ``OSError``. An empty stderr leaves no file."""
    folder = home / TAIL_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    if folder.stat().st_mode & 0o077:  # widened since (a chmod, a restored backup)
        folder.chmod(0o700)
    if data:
        path = tail_path(home, run_id)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with open(fd, "wb") as handle:
            os.fchmod(fd, 0o600)  # one that was there keeps its mode otherwise
            handle.write(data[-TAIL_BYTES:])


def prune_tails(home: Path, *, now: float | None = None) -> int:
    """Remove the tails older than :data:`~prohost.engine.retention.KEEP_RUNS_S`
    (written before ``now``, epoch s, less that); how many were removed. Blocking."""
    cutoff = (time.time() if now is None else now) - KEEP_RUNS_S
    removed = 0
    with contextlib.suppress(FileNotFoundError), os.scandir(home / TAIL_DIR) as entries:
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):
                if entry.name.endswith(".log") and entry.stat().st_mtime < cutoff:
                    os.unlink(entry.path)
                    removed += 1
    return removed


def read_tail(home: Path, run_id: str) -> str | None:
    """``run_id``'s kept stderr as text (undecodable bytes replaced), or ``None``."""
    try:
        data = tail_path(home, run_id).read_bytes()
    except FileNotFoundError:
        return None
    return data.decode("utf-8", "replace")
