"""A lane folder's marker, ``.prohost-lane``: which lane the folder is for, when it
was last used (for collection), and the harness's records of its worktrees (which
checkouts were handed to an agent, each one's git dir, a move still to finish).
Written atomically, out of every run's reach (the lane folder is only readable to
its runs); read by :mod:`prohost.engine.repos.worktrees`, its collection
(:mod:`prohost.engine.repos.collect`) and the lanes' names
(:mod:`prohost.engine.repos.lanenames`). Every function here is blocking.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
from pathlib import Path

import attrs

LANE_MARKER = ".prohost-lane"


@attrs.frozen
class LaneMarker:
    """What ``.prohost-lane`` in a lane folder records."""

    lane: str | None
    last_used: float | None
    ready: dict[str, str] | None
    """Checkout name → source, for each worktree a prepare finished and handed to an
    agent. Anything else found in the folder was never used, so it holds no work:
    the leftovers of a cancelled or killed prepare. ``None``: not known."""
    git_dirs: dict[str, str] | None = None
    """Checkout name → its private git dir (``<common>/worktrees/<name>``, a real
    path), as the harness made it: the record every later git on the worktree, and
    the next run's rules, are made from (§13), never its ``.git`` file. The marker
    is out of every run's reach (the lane folder is only readable to its runs)."""
    moved: dict[str, str] | None = None
    """Checkout name → the git dir in the person's repository of a worktree an
    earlier version made, moved to the lane's repository (:mod:`migrate`) and not
    yet removed there: the next prepare removes it."""


def read_marker(folder: Path) -> LaneMarker:
    """``folder``'s marker; a field that is missing or unreadable is ``None``."""
    try:
        data = json.loads((folder / LANE_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return LaneMarker(None, None, None)
    if not isinstance(data, dict):
        return LaneMarker(None, None, None)
    git_dirs, moved = (_names(data.get(key)) for key in ("git_dirs", "moved"))
    lane = data.get("lane")
    used = data.get("last_used")
    if isinstance(used, bool) or not isinstance(used, int | float) or not math.isfinite(used):
        used = None
    ready = data.get("ready")
    if not (isinstance(ready, dict) and all(isinstance(v, str) for v in ready.values())):
        ready = None
    return LaneMarker(
        lane if isinstance(lane, str) else None,
        float(used) if used is not None else None,
        ready,
        git_dirs,
        moved,
    )


def _names(value: object) -> dict[str, str] | None:
    """A marker's map of checkout names to paths; ``None`` for anything else."""
    if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
        return value
    return None


def write_marker(folder: Path, marker: LaneMarker) -> None:
    """Create the lane folder and write its marker, atomically: GC may read it at any moment."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f"{LANE_MARKER}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    # ensure_ascii (the default) escapes a lone surrogate a lane id may carry.
    payload = {"lane": marker.lane, "last_used": marker.last_used, "ready": marker.ready,
               "git_dirs": marker.git_dirs, "moved": marker.moved}
    try:
        tmp.write_text(json.dumps(payload, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, folder / LANE_MARKER)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def record_ready(folder: Path, ready: dict[str, str], git_dirs: dict[str, str]) -> None:
    """Blocking: the marker as it is on disk now, with the entries of ``ready`` and
    ``git_dirs`` added (what a move recorded meanwhile stays)."""
    marker = read_marker(folder)
    write_marker(folder, attrs.evolve(marker, ready={**(marker.ready or {}), **ready},
                                      git_dirs={**(marker.git_dirs or {}), **git_dirs}))


def record_move(folder: Path, name: str, git_dir: str, old_git_dir: str | None) -> None:
    """Blocking: the marker as it is on disk now, the checkout ``name`` recorded with
    its new ``git_dir``, and ``old_git_dir`` as its git dir still to remove from
    the person's repository (``None``: nothing left to remove)."""
    marker = read_marker(folder)
    moved = dict(marker.moved or {})
    if old_git_dir is None:
        moved.pop(name, None)
    else:
        moved[name] = old_git_dir
    write_marker(folder, attrs.evolve(
        marker, git_dirs={**(marker.git_dirs or {}), name: git_dir}, moved=moved))


def touch_marker(folder: Path, lane: str, now: float) -> LaneMarker:
    """Record a use of the lane now, keeping what the marker knew; return the new marker."""
    # A new lane's folder certainly holds no finished worktree; an existing folder
    # whose marker is unreadable might, so there "ready" stays unknown.
    old = LaneMarker(None, None, {}, {}) if not folder.exists() else read_marker(folder)
    marker = LaneMarker(lane, now, old.ready, old.git_dirs, old.moved)
    write_marker(folder, marker)
    return marker
