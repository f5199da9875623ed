"""An agent CLI's own folders, as a confined run is granted them (docs/protocol.md
§13): never the person's own.

Claude's and Codex's are the conversation's folder of the run's account (the
harness's, named by ``CLAUDE_CONFIG_DIR`` or ``CODEX_HOME``). An ACP agent's are
folders of the harness's under ``$PROHOST_HOME/agents``, the conversation's own,
shown where the agent looks for them: through an overlay of the person's folder
whose writes land in the harness's (the person's settings and login are seen,
nothing a run writes reaches the person's own sessions), or bound there where the
person has none or overlays cannot be mounted. :func:`agent_folders` says which;
:func:`overlays_mount` asks bubblewrap once whether overlays work here; each
confinement's overlay work folders (:func:`new_work_folder`) are removed by
:func:`remove_work_folders`. :mod:`prohost.engine.run.confine` puts them into a
run's policy.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import stat
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path

import attrs

from prohost.engine.accounts.book import folder_variables
from prohost.engine.repos.worktrees import lane_folder_name
from prohost.engine.sandbox import (
    ConfinementFailed,
    Support,
    defaults,
)

log = logging.getLogger("prohost.confine")

#: The harness's own folders for ACP agents (:data:`defaults.AGENT_FOLDERS`), under
#: ``$PROHOST_HOME``.
AGENTS_FOLDER = "agents"


@attrs.frozen
class AgentFolders:
    """What an agent CLI may write of its own (see :func:`agent_folders`)."""

    #: Folders granted writable: the harness's own.
    writable: tuple[Path, ...] = ()
    #: (harness's folder, where the agent looks): bound there (the person has none).
    mounts: tuple[tuple[Path, Path], ...] = ()
    #: (the person's folder, the harness's folder taking the writes, overlayfs's
    #: work folder): the person's seen through an overlay (``Policy.overlays``).
    overlays: tuple[tuple[Path, Path, Path], ...] = ()


class PersonFolderRefused(ConfinementFailed):
    """An ACP agent's folder of the person's cannot be shown to a run."""


def agent_folders(brain: str, env: Mapping[str, str], user_home: Path, home: Path, *,
                  work: Path | None = None, hidden: tuple[Path, ...] = (),
                  lane: str = "") -> AgentFolders:
    """What the agent CLI may write of its own. Claude's and Codex's (also for
    their ACP adapters) are the conversation's folder of the account its variable
    names (``CLAUDE_CONFIG_DIR``, ``CODEX_HOME``), and Claude Code's login store
    (``CLAUDE_SECURESTORAGE_CONFIG_DIR``, the account's, shared by its
    conversations: :mod:`prohost.engine.accounts.logins`), made when missing. An ACP agent of
    :data:`~prohost.engine.sandbox.defaults.AGENT_FOLDERS` writes folders of the
    harness's under ``home``, its conversation's own
    (``$PROHOST_HOME/agents/<agent>/<lane folder>/…``, ``lane`` named as a lane's
    worktrees folder is, never as the server sent it). With ``work``
    (the confinement can mount overlays), where the person has that folder under
    ``user_home`` the run sees the person's through an overlay whose writes land
    in the harness's (its settings and login are seen, nothing the run writes
    reaches the person's own sessions, and what one run wrote the next one sees),
    overlayfs's work folders made fresh under ``work`` (one per confinement: two
    mounts must not share one; removed by :meth:`RunConfinement.close`).
    Otherwise, or where the person has none, the harness's folder is bound there
    (Landlock alone grants it and leaves the person's read-only). The plain
    brain gets none, and nothing is ever the person's own folder written (§13).

    Raises :class:`PersonFolderRefused` for a person's folder that is a symbolic
    link, not a folder, or lies in one of ``hidden`` (real paths are compared):
    an overlay there would show what is hidden. Blocking."""
    if brain in defaults.AGENT_FOLDERS:
        return _acp_folders(brain, user_home, home / AGENTS_FOLDER / brain
                            / (lane_folder_name(lane) if lane else "no-lane"), work, hidden)
    # The conversation's own folder, and for Claude Code the account's login store
    # every conversation shares (CLAUDE_SECURESTORAGE_CONFIG_DIR: its credentials and
    # its refresh lock; nothing there is read as settings).
    folders = []
    for variable in folder_variables(brain):
        configured = env.get(variable, "").strip()
        if configured:
            folder = Path(configured)
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            folders.append(folder)
    return AgentFolders(writable=tuple(dict.fromkeys(folders)))


#: Under the harness's agent folders: each confinement's overlayfs work folders.
OVERLAY_WORK = ".overlay-work"


def new_work_folder(home: Path) -> Path:
    """A fresh folder for one confinement's overlay work folders (not made yet)."""
    return home / AGENTS_FOLDER / OVERLAY_WORK / secrets.token_hex(8)


_OVERLAYS: dict[str, bool] = {}


_OVERLAYS_LOCK = threading.Lock()


def overlays_mount(support: Support | None, home: Path) -> bool:
    """Whether a run's confinement can show a person's folder through an overlay:
    bubblewrap, and overlayfs in an unprivileged user namespace (Linux 5.11 and
    later), tried once per bubblewrap by mounting one in ``home`` (its answer is
    kept: a few milliseconds, once). Where it cannot, ACP agents' folders are the
    harness's alone, bound as before (logged once). Blocking."""
    if support is None or support.kind != "bwrap" or not support.bwrap:
        return False
    with _OVERLAYS_LOCK:
        known = _OVERLAYS.get(support.bwrap)
        if known is None:
            known = _OVERLAYS[support.bwrap] = _try_overlay(support.bwrap, home)
        return known


def _try_overlay(bwrap: str, home: Path) -> bool:
    root = new_work_folder(home)
    lower, upper, work = root / "lower", root / "upper", root / "work"
    try:
        for folder in (lower, upper, work):
            folder.mkdir(mode=0o700, parents=True)
        done = subprocess.run(
            [bwrap, "--unshare-user", "--ro-bind", "/", "/", "--overlay-src", str(lower),
             "--overlay", str(upper), str(work), str(lower), "true"],
            capture_output=True, timeout=30, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        said = str(exc)
    else:
        if done.returncode == 0:
            return True
        said = done.stderr.decode(errors="replace").strip()
    finally:
        remove_work_folders(root)
    log.warning("bubblewrap cannot mount an overlay here (%s): ACP agents get folders of "
                "the harness's alone, without your settings and login (docs/security.md)",
                said)
    return False


def _acp_folders(brain: str, user_home: Path, owned: Path, work: Path | None,
                 hidden: tuple[Path, ...]) -> AgentFolders:
    hidden_real = [Path(os.path.realpath(place)) for place in hidden]
    writable: list[Path] = []
    mounts: list[tuple[Path, Path]] = []
    overlays: list[tuple[Path, Path, Path]] = []
    for index, name in enumerate(defaults.AGENT_FOLDERS[brain]):
        upper, seen = owned / name, user_home / name
        upper.mkdir(mode=0o700, parents=True, exist_ok=True)
        writable.append(upper)
        try:
            if work is None:
                raise FileNotFoundError  # no overlays: the harness's folder is bound
            info = os.lstat(seen)
        except FileNotFoundError:
            # Where the agent looks must exist for bubblewrap to bind the harness's
            # folder there (the home is read-only in the run's view): made empty,
            # as the agent itself would make it; the person's is never granted.
            seen.mkdir(mode=0o700, parents=True, exist_ok=True)
            mounts.append((upper, seen))
            continue
        _refuse_person_folder(seen, name, info, hidden_real)
        # Fresh, 0700, beside the uppers (overlayfs needs both on one filesystem),
        # in $PROHOST_HOME where no run sees it.
        folder = work / str(index)
        folder.mkdir(mode=0o700, parents=True)
        if os.stat(folder).st_dev != os.stat(upper).st_dev:
            log.warning("cannot show %s to a run through an overlay: %s and %s are on "
                        "different filesystems", seen, upper, folder)
            raise PersonFolderRefused(
                f"the harness's folders for {brain} are not on one filesystem (named in "
                "the harness's log): keep $PROHOST_HOME/agents on one filesystem")
        overlays.append((seen, upper, folder))
    return AgentFolders(tuple(writable), tuple(mounts), tuple(overlays))


def _refuse_person_folder(seen: Path, name: str, info: os.stat_result,
                          hidden: list[Path]) -> None:
    """Raise :class:`PersonFolderRefused` unless ``seen`` (``~/<name>``, lstat'ed as ``info``) is a
    folder, not a link, outside every ``hidden`` place (real paths)."""
    if stat.S_ISLNK(info.st_mode):
        why = "is a symbolic link, which the harness does not follow into a run's view"
    elif not stat.S_ISDIR(info.st_mode):
        why = "is not a folder"
    else:
        real = Path(os.path.realpath(seen))
        held = [place for place in hidden if real == place or place in real.parents]
        if not held:
            return
        why = "lies in a place runs may not see"
    log.warning("refusing to show %s to a run: it %s", seen, why)
    raise PersonFolderRefused(
        f"the agent's own folder ~/{name} {why} (named in the harness's log): make it "
        "a plain folder of its own, or remove it")


def remove_work_folders(folder: Path) -> None:
    """Remove ``folder`` (``<work>/<index>``, each holding overlayfs's own ``work``
    at mode 0) with what overlayfs left in it. Never raises. Blocking."""
    if not os.path.lexists(folder):
        return  # none made (no overlay): the usual case, with no glob to pay for
    with contextlib.suppress(OSError):
        for entry in folder.glob("*/*"):
            if not entry.is_symlink() and entry.is_dir():
                os.chmod(entry, 0o700)
    shutil.rmtree(folder, ignore_errors=True)
