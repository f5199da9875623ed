"""The names a person types for a conversation's worktrees and branch (issue 40,
point 5): ``$PROHOST_HOME/worktrees/<name>/`` and ``prohost/<name>``.

A lane's name is its conversation's id made safe (a run without a conversation:
its run id): ASCII letters, digits, ``_`` and ``-`` only, never empty, at most
:data:`MAX_NAME` characters, so no id from the wire can name a path outside the
worktrees folder or a ref git refuses. Where two lanes would have the same name
(``a b`` and ``a-b``; ``App`` and ``app``, one folder on macOS), the later one gets
a short suffix of its own, from a hash of its whole id.

Which lane has which name is the harness's record, not a function of the id: the
file :data:`NAMES_FILE` beside the worktrees folder, kept for as long as the home (a
conversation whose worktrees were collected keeps its name, and its branch in the
person's repository keeps its commits, which no other conversation may take
over). A lane the file does not list yet is looked for in the lane folders'
markers first (``.prohost-lane``: the lane each folder is for): so the folders an
earlier version named (``conv-alpha-<20 hex>``) keep being found, by what the
harness recorded in them, and keep their names and branches.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path

from prohost.files import write_atomically

#: The record of every lane's name, in the home (beside the worktrees folder,
#: which holds lane folders only).
NAMES_FILE = "worktree-names.json"
#: At most this many characters of the id are kept in a name.
MAX_NAME = 40
#: The suffix's first length (hex digits of a hash of the lane id); longer when
#: that one is taken too.
_SUFFIX_LENGTHS = (4, 6, 8, 12, 20)
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_CONVERSATION = "conv:"
_RUN = "run:"


def base_name(lane: str) -> str:
    """What a person would call ``lane`` (a conversation's id, or a lone run's),
    made safe: letters, digits, ``_`` and ``-``; never empty."""
    if lane.startswith(_CONVERSATION):
        text, fallback = lane[len(_CONVERSATION):], "conversation"
    elif lane.startswith(_RUN):
        text, fallback = lane[len(_RUN):], "run"
    else:
        text, fallback = lane, "lane"
    name = _UNSAFE.sub("-", text).strip("-_")[:MAX_NAME].rstrip("-_")
    return name or fallback


def _hash(lane: str, length: int) -> str:
    # surrogatepass: a lane id comes from JSON, which can carry a lone surrogate.
    return hashlib.sha256(lane.encode("utf-8", "surrogatepass")).hexdigest()[:length]


def candidates(lane: str) -> list[str]:
    """The names ``lane`` may get, in order: the readable one, then with ever
    longer suffixes."""
    base = base_name(lane)
    return [base, *(f"{base}-{_hash(lane, length)}" for length in _SUFFIX_LENGTHS)]


class LaneNames:
    """The record of the lanes' names of the worktrees folder ``root`` (kept in the
    folder above it, the home).

    Blocking (file reads and one durable write per new lane): callers in trio run
    it in a worker thread, bounded. Safe from several threads at once (one lock);
    a harness is the one writer of its home (``agent gc`` only reads).
    """

    def __init__(self, root: Path, read_lane: Callable[[Path], str | None]) -> None:
        """``read_lane(folder)``: the lane a lane folder's marker names (``None``:
        none readable)."""
        self.root = root
        #: The file that records them.
        self.record = root.parent / NAMES_FILE
        self._read_lane = read_lane
        self._lock = threading.Lock()

    def lookup(self, lane: str) -> str | None:
        """``lane``'s name, if it has one (recorded, or found in a folder's marker)."""
        with self._lock:
            names = self._load()
            return names.get(lane) or self._found_in_markers(lane)

    def name_for(self, lane: str) -> str:
        """``lane``'s name, given now (and recorded durably) if it had none. Raises
        :class:`OSError` when the record cannot be written."""
        with self._lock:
            names = self._load()
            name = names.get(lane) or self._found_in_markers(lane)
            if name is None:
                taken = {value.casefold() for value in names.values()} | self._folders()
                name = next((c for c in candidates(lane) if c.casefold() not in taken),
                            None)
                if name is None:  # every suffix taken: only a hash of the whole id
                    name = f"{base_name(lane)}-{_hash(lane, 40)}"
            if names.get(lane) != name:
                self._save({**names, lane: name})
            return name

    def forget(self, lane: str) -> None:
        """Drop ``lane``'s name (its folder and branch are gone): another lane may
        take it. Raises :class:`OSError` when the record cannot be written."""
        with self._lock:
            names = self._load()
            if names.pop(lane, None) is not None:
                self._save(names)

    def _load(self) -> dict[str, str]:
        try:
            data = json.loads(self.record.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except ValueError:
            data = None
        if not isinstance(data, dict) or not isinstance(data.get("lanes"), dict):
            # Damaged: rebuilt from the markers, lane by lane, as for a new home.
            return {}
        return {lane: name for lane, name in data["lanes"].items()
                if isinstance(lane, str) and isinstance(name, str) and _safe(name)}

    def _save(self, names: dict[str, str]) -> None:
        self.record.parent.mkdir(parents=True, exist_ok=True)
        # ensure_ascii (the default) escapes a lone surrogate a lane id may carry.
        text = json.dumps({"lanes": names}, sort_keys=True, indent=1) + "\n"
        write_atomically(self.record, text.encode("ascii"))

    def _folders(self) -> set[str]:
        """The lane folders there are, by name (casefolded)."""
        try:
            return {entry.name.casefold() for entry in os.scandir(self.root)}
        except FileNotFoundError:
            return set()

    def _found_in_markers(self, lane: str) -> str | None:
        """The folder whose marker says it is ``lane``'s (one an earlier version
        named, or one whose record was lost)."""
        with contextlib.suppress(FileNotFoundError):
            for entry in sorted(os.scandir(self.root), key=lambda e: e.name):
                if entry.is_dir(follow_symlinks=False) and _safe(entry.name) \
                        and self._read_lane(Path(entry.path)) == lane:
                    return entry.name
        return None


def _safe(name: str) -> bool:
    """A name no record, damaged or planted, can turn into another path."""
    return bool(name) and len(name) <= 128 and _UNSAFE.search(name) is None \
        and name.strip("-_") == name
