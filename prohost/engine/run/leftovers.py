"""What a conversation or a crashed harness leaves in the harness's agent folders,
and its removal (issue 36, point 5).

A conversation's CLI folders of every account
(``$PROHOST_HOME/cli/<account>/lanes/<lane folder>``,
:mod:`prohost.engine.accounts.logins`) and its ACP agents' folders
(``$PROHOST_HOME/agents/<agent>/<lane folder>``, :mod:`prohost.engine.run.confine`)
go with its worktrees (``agent gc``, the daily pass), or, where it has none (without
``--repos``), by themselves once it has had no run for the same period (the daily
pass, :mod:`prohost.engine.supervisor.upkeep`); the overlays' work folders a
killed harness left are swept at the next start and by ``agent gc``. Everything
here is what runs could write: removed without following a link.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from prohost.engine.accounts.book import LANES_FOLDER
from prohost.engine.accounts.logins import CLI_FOLDER
from prohost.engine.run.agentfolders import AGENTS_FOLDER, OVERLAY_WORK, remove_work_folders


def conversation_folders(home: Path, lane_folder: str) -> list[Path]:
    """The agent folders of the harness's that are the conversation's own (whose
    lane folder name is ``lane_folder``), as they exist now: each account's CLI
    folders (``$PROHOST_HOME/cli/<account>/lanes/<lane folder>``) and each ACP
    agent's (``$PROHOST_HOME/agents/<agent>/<lane folder>``). Removed with the
    conversation's worktrees (``agent gc``): its sessions go with them, and its
    next turn starts a fresh one. Blocking."""
    found = []
    for pattern in (f"{CLI_FOLDER}/*/{LANES_FOLDER}/{lane_folder}",
                    f"{AGENTS_FOLDER}/*/{lane_folder}"):
        found += [path for path in home.glob(pattern) if not path.is_symlink()]
    return sorted(found)


def conversations_with_folders(home: Path) -> dict[str, list[Path]]:
    """Every conversation (by its lane folder's name) that has agent folders of the
    harness's now, each with :func:`conversation_folders`. Blocking."""
    found: dict[str, list[Path]] = {}
    for pattern in (f"{CLI_FOLDER}/*/{LANES_FOLDER}/*", f"{AGENTS_FOLDER}/*/*"):
        for path in home.glob(pattern):
            if path.name.startswith(".") or path.is_symlink() or not path.is_dir():
                continue  # the overlays' work folders (.overlay-work) are no lane's
            found.setdefault(path.name, []).append(path)
    return {name: sorted(folders) for name, folders in sorted(found.items())}


def last_written(folders: list[Path]) -> float:
    """When any of ``folders`` or what lies directly in them last changed (epoch s;
    0 when none can be read), never following a link: a conversation's idle time
    where the ledger no longer knows it. Blocking."""
    newest = 0.0
    for folder in folders:
        with contextlib.suppress(OSError):
            newest = max(newest, os.lstat(folder).st_mtime)
            with os.scandir(folder) as entries:
                for entry in entries:
                    with contextlib.suppress(OSError):
                        newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
    return newest


def forget_conversation(home: Path, lane_folder: str) -> None:
    """Remove every one of :func:`conversation_folders` (``agent gc``, with the
    conversation's worktrees). Raises OSError when one cannot be. Blocking."""
    for folder in conversation_folders(home, lane_folder):
        remove_folder(folder)


def remove_folder(folder: Path) -> None:
    """Remove ``folder`` and all it holds, never following a link (a link there is
    removed itself); folders a run left unreadable (mode 0) are opened up first.
    Raises OSError when it cannot. Blocking."""
    if os.path.islink(folder):
        folder.unlink()
        return
    if not os.path.lexists(folder):
        return
    waiting = [str(folder)]
    while waiting:  # a loop, not recursion: a run may nest folders deeply
        path = waiting.pop()
        with contextlib.suppress(OSError):
            os.chmod(path, 0o700)
            with os.scandir(path) as entries:
                waiting += [entry.path for entry in entries
                            if entry.is_dir(follow_symlinks=False)]
    shutil.rmtree(folder)


def sweep_overlay_work(home: Path) -> int:
    """Remove the overlays' work folders (``$PROHOST_HOME/agents/.overlay-work/*``)
    that confinements of an earlier process left (a kill -9 skips
    :meth:`RunConfinement.close`); how many. Call it at start, before any run of
    this harness (the instance lock keeps every other harness off this home), or
    from ``agent gc`` holding that lock: every one is then a leftover. Blocking."""
    root = home / AGENTS_FOLDER / OVERLAY_WORK
    try:
        entries = [entry for entry in os.scandir(root) if not entry.is_symlink()]
    except FileNotFoundError:
        return 0
    for entry in entries:
        remove_work_folders(Path(entry.path))
    return len(entries)
