"""What a conversation or a crashed harness leaves in the harness's agent folders,
and its removal (issue 36, point 5).

A conversation's CLI folders of every account
(``$PROHOST_HOME/cli/<account>/lanes/<lane folder>``,
:mod:`prohost.engine.accounts.logins`) and its ACP agents' folders
(``$PROHOST_HOME/agents/<agent>/<lane folder>``, :mod:`prohost.engine.run.confine`)
go with its worktrees (``agent gc``, the daily pass); the overlays' work folders a
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
from prohost.engine.run.confine import AGENTS_FOLDER, OVERLAY_WORK, remove_work_folders


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
