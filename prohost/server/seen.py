"""When each paired harness was last connected, kept across restarts of the server.

After the server restarts, its harnesses dial again on their own, at most
``BACKOFF_CAP_S`` (30 s) apart; meanwhile none is connected. ``prohost send``
used to say "no harness is connected … (start one with `prohost agent run`)" to a
person whose harness was running and about to come back. With this record the
server's ``GET /v1/status`` lists the harnesses *expected back* (connected until
recently, and not gone on purpose), and ``send`` says so and waits.

The record lives in ``DIR/harnesses-seen.json`` (``prohost server --state DIR``;
machine names and times only, no token), written when a harness connects or goes,
and at most every :data:`SAVE_EVERY_S` while it stays (so that a server killed
with ``kill -9`` still knows who was there a moment before). It is a hint: a file
that cannot be read or written is logged and otherwise ignored.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import attrs

from prohost.files import write_atomically

log = logging.getLogger("prohost.server")

SEEN_FILE = "harnesses-seen.json"
_FORMAT = 1
#: A harness that went without saying it drains is expected back for this long
#: (seconds) after it went, or after this server started if it went before: three
#: of its longest waits between two tries (30 s), which a running harness never
#: exceeds.
EXPECTED_BACK_S = 90.0
#: While a harness stays connected, its "last seen" is saved at most this often.
SAVE_EVERY_S = 30.0


@attrs.define
class Seen:
    """One harness, by its machine name: when it was last connected (wall time) and
    whether it went on purpose (it said it drains: ``agent stop``, a signal)."""

    machine: str
    at: float
    left: bool = False


def load_seen(state_dir: Path) -> dict[str, Seen]:
    """The record in ``state_dir`` (empty when there is none or it cannot be read)."""
    path = state_dir / SEEN_FILE
    try:
        data = json.loads(path.read_bytes())
        entries = data["harnesses"] if data.get("format") == _FORMAT else []
        found = [Seen(str(e["machine"]), float(e["at"]), bool(e.get("left", False)))
                 for e in entries]
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("cannot read %s (%s); the server does not know which harnesses were "
                    "connected before it started", path, exc)
        return {}
    return {seen.machine: seen for seen in found}


def save_seen(state_dir: Path, seen: dict[str, Seen]) -> None:
    """Write the record to ``state_dir`` (a failure is logged, not raised)."""
    entries = [attrs.asdict(entry) for entry in seen.values()]
    payload = json.dumps({"format": _FORMAT, "harnesses": entries}, indent=2) + "\n"
    try:
        # Not fsync'd: a record lost with the machine's power costs one hint.
        write_atomically(state_dir / SEEN_FILE, payload.encode("utf-8"), 0o600,
                         durable=False)
    except OSError as exc:
        log.warning("cannot save which harnesses were connected in %s: %s", state_dir,
                    exc.strerror or exc)


def expected_back(seen: dict[str, Seen], connected: set[str], now: float,
                  started_at: float) -> list[tuple[str, float]]:
    """The harnesses not connected now that should be back soon, with how many
    seconds ago each was last connected, most recent first."""
    found = [
        (entry.machine, max(0.0, now - entry.at))
        for entry in seen.values()
        if entry.machine not in connected and not entry.left
        and now - max(entry.at, started_at) < EXPECTED_BACK_S
    ]
    return sorted(found, key=lambda item: item[1])
