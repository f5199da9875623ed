"""The reference server's pairings on disk (``prohost server --state DIR``).

Without it every restart of the server forgot every harness: each came back with
a 401 and had to pair again with a new code. With it the pairings live in
``DIR/pairings.json`` (mode 0600: it holds every harness's token and secret),
written atomically after each new pairing, so a crash leaves the old file or the
new one, never half of either. Runs are not kept: a restarted server starts with
none, as the harnesses' ledgers expect of a server that forgot (§2 ``unknown``).
"""

from __future__ import annotations

import json
from pathlib import Path

from prohost.files import write_atomically
from prohost.server.records import Harness

PAIRINGS_FILE = "pairings.json"
_FORMAT = 1


class StateError(Exception):
    """The state folder or its file cannot be used; the message says which and why."""


def pairings_path(state_dir: Path) -> Path:
    return state_dir / PAIRINGS_FILE


def load_pairings(state_dir: Path) -> dict[str, Harness]:
    """The pairings saved in ``state_dir`` (none when it has no file yet).

    Makes ``state_dir`` (0700) if missing. Raises :class:`StateError` for a file
    that cannot be read or is not what this module writes.
    """
    path = pairings_path(state_dir)
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise StateError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(raw)
        entries = data["harnesses"] if data.get("format") == _FORMAT else None
        if not isinstance(entries, list):
            raise ValueError("no harnesses list")
        harnesses = [
            Harness(token=str(e["token"]), secret=str(e["secret"]),
                    machine=str(e["machine"]), paired_at=float(e["paired_at"]))
            for e in entries
        ]
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise StateError(
            f"{path} is damaged ({exc}); move it away to start with no pairings"
        ) from None
    return {h.token: h for h in harnesses}


def save_pairings(state_dir: Path, harnesses: dict[str, Harness]) -> None:
    """Write every pairing to ``state_dir`` atomically, mode 0600 (fsync'd: a pairing
    the server answered must survive a power cut as the harness's credentials do)."""
    entries = [
        {"token": h.token, "secret": h.secret, "machine": h.machine, "paired_at": h.paired_at}
        for h in harnesses.values()
    ]
    payload = json.dumps({"format": _FORMAT, "harnesses": entries}, indent=2) + "\n"
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_atomically(pairings_path(state_dir), payload.encode("utf-8"), 0o600)
