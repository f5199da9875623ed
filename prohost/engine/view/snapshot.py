"""A frozen picture of the harness, for the panel and ``prohost agent status``.

The panel never reads the harness's live state: it renders a :class:`Snapshot`
taken at one instant, so a frame can never show a run both queued and running.
The same snapshot, as JSON, is what the running harness keeps in
``$PROHOST_HOME/status.json`` (written atomically, at most once a second) for
``prohost agent status`` to print.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import attrs

from prohost.engine.accounts.spend import SpendRow
from prohost.files import write_atomically
from prohost.wire.protocol import AccountRow, converter, structure

STATUS_FILE = "status.json"
#: A snapshot is rewritten at least this often while the harness runs, so one
#: older than :data:`STALE_AFTER_S` means the harness is gone (or hung).
REFRESH_S = 5.0
STALE_AFTER_S = 30.0

Connection = Literal["connecting", "connected", "reconnecting", "draining", "stopping",
                     # Only in the panel's last frame, once the harness has finished:
                     "drained", "stopped", "exited"]


@attrs.frozen
class RunRow:
    run_id: str
    lane: str
    conversation: str | None
    state: str
    #: Seconds since the run started executing (None while queued).
    elapsed_s: float | None = None
    activity: str | None = None
    #: Seconds since the agent last printed anything, on stdout or stderr (None: not
    #: running, or nothing read yet).
    quiet_s: float | None = None
    #: The idle timeout (--idle-timeout) that stops it once ``quiet_s`` reaches it
    #: (None: no idle limit).
    idle_limit_s: float | None = None


@attrs.frozen
class FinishedRow:
    run_id: str
    conversation: str | None
    ok: bool
    error: str | None
    duration_s: float | None
    finished_at: float
    #: What it changed, in a few words (``3 files (+12 −2), 1 commit``; --repos only).
    changes: str | None = None
    #: Its tokens (in + out) and cost, as its CLI reported them (§7 ``usage``).
    tokens: int | None = None
    cost_usd: float | None = None


@attrs.frozen
class Snapshot:
    taken_at: float
    pid: int
    version: str
    connection: Connection
    server: str
    machine: str
    brain: str
    slots: int
    slots_used: int
    queued: int
    brain_version: str | None = None
    model: str | None = None
    #: The mode the latest run's agent was in (an ACP session's, ``--acp-mode``).
    mode: str | None = None
    reconnect_in_s: float | None = None
    last_error: str | None = None
    #: Seconds since the last heartbeat went out (None: none yet on this connection).
    heartbeat_age_s: float | None = None
    runs: tuple[RunRow, ...] = ()
    finished: tuple[FinishedRow, ...] = ()
    #: Every agent account and its usage-limit state (docs/protocol.md §12).
    accounts: tuple[AccountRow, ...] = ()
    #: ``confined (Landlock ABI 7)`` or ``NOT confined: <reason>`` (§13); ``None``:
    #: a harness from before confinement.
    confinement: str | None = None
    #: Reports that outlived their retry window and wait in the ledger's outbox (§7),
    #: and when the oldest of their runs finished (epoch s; None when none waits).
    reports_waiting: int = 0
    reports_waiting_since: float | None = None
    #: Today's runs, tokens and cost per account, then all together (local day).
    spend_today: tuple[SpendRow, ...] = ()

    def to_json(self) -> str:
        return json.dumps(converter.unstructure(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> Snapshot:
        return structure(json.loads(text), cls, path="status")


def write_snapshot(home: Path, snapshot: Snapshot) -> None:
    """Replace ``status.json`` atomically, readable by this user only.

    Not fsync'd: it is rewritten up to once a second while runs execute, and one
    lost with the machine is harmless (the next harness writes a new one; a reader
    of a damaged one is told the file is not a snapshot).
    """
    write_atomically(home / STATUS_FILE, snapshot.to_json().encode("utf-8"), 0o600,
                     durable=False)


def read_snapshot(home: Path) -> Snapshot | None:
    """The last snapshot a harness on ``home`` wrote, or ``None`` if there is none.

    Raises ``ValueError`` (with a message naming the file) when it is unreadable.
    """
    path = home / STATUS_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        return Snapshot.from_json(text)
    except ValueError as exc:
        raise ValueError(f"{path} is not a prohost status snapshot ({exc})") from None
