"""Which process is which: finding a previous harness's agent at restart (§7).

At restart the ledger only has the process group recorded when a run started;
:func:`process_belongs_to_run` decides whether that group is still the run's
agent (and so must be killed) or a number the kernel has since reused. It reads
``/proc`` on Linux and runs ``ps`` on macOS: blocking, so call it from a thread
(the harness does, bounded by :meth:`prohost.engine.blocking.Bounds.run`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["groups_of_run", "live_group_members", "process_belongs_to_run"]

#: How many times an empty ``/proc/<pid>/environ`` of a live process is read again
#: before the process is taken as not ours (count).
ENVIRON_TRIES = 20
#: Pause between those reads (s): a process caught in ``execve`` has no environment
#: to show for a moment; 20 × 0.05 s waits out any ordinary exec.
ENVIRON_RETRY_S = 0.05
#: Bound on one ``ps`` call (s).
PS_TIMEOUT_S = 10.0


def process_belongs_to_run(pgid: int, run_id: str) -> bool:
    """Whether process group ``pgid`` is alive and really is run ``run_id``'s agent.

    At restart the ledger only has the group id recorded when the run started; the
    group may be long gone and its number reused by anything. So the group must be
    alive and a process in it (the leader first) must have been started with
    ``PROHOST_RUN_ID=<run_id>`` in its environment, which every agent and its children
    inherit. The leader may have exited while its children live on, so the other
    members of the group are checked too. A live member whose environment reads as
    empty (caught in the middle of ``execve``) is looked at again, a bounded number
    of times, before it is taken as not ours. False whenever that cannot be
    established (another user's process, no ``/proc`` and no ``ps``, an unsupported
    platform).

    Blocking (reads ``/proc``, or runs ``ps`` on macOS): call it from a thread.
    """
    # Zero and negative numbers mean "my own group" or "every process" to killpg, and
    # 1 is init's: none of them can be an agent's group.
    if pgid <= 1:
        return False
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        # PermissionError: the group exists but belongs to another user, so it is not
        # an agent this harness started.
        return False
    except OSError:
        return False
    needle = f"PROHOST_RUN_ID={run_id}"
    if sys.platform.startswith("linux") and os.path.isdir("/proc/self"):
        return any(needle in _settled_environ(pid) for pid in _group_members(pgid))
    if sys.platform == "darwin":
        return any(needle in _ps_environ(pid) for pid in _group_members(pgid))
    return False


def groups_of_run(run_id: str) -> list[int]:
    """The process groups that hold a process started with ``PROHOST_RUN_ID=<run_id>``.

    For a run whose group was never recorded: a harness killed between the agent's
    spawn and the commit of its group leaves a ``started`` row without one, and its
    agent may live on (one that prints nothing never meets a closed pipe). Every
    process of the agent inherits the marker, so the groups holding one are its.
    Never this process's own group, nor init's. Empty where that cannot be found
    (no ``/proc`` and no ``ps``, an unsupported platform).

    Blocking (reads every ``/proc/<pid>/environ``, or runs ``ps``): call it from a
    thread.
    """
    needle = f"PROHOST_RUN_ID={run_id}"
    own = os.getpgrp()
    found: list[int] = []
    for pid, pgid in _every_process():
        if pgid <= 1 or pgid == own or pgid in found:
            continue
        environ = (_proc_environ(pid) or set()) if sys.platform.startswith("linux") \
            else _ps_environ(pid)
        if needle in environ:
            found.append(pgid)
    return found


def live_group_members(pgid: int) -> list[int] | None:
    """The processes of group ``pgid`` that have not finished (a zombie has), or
    ``None`` where that cannot be told (no ``/proc`` and no ``ps``).

    For the sweep after an agent's leader exits: a zombie whose parent is gone may
    wait long to be reaped (a container whose init reaps nothing), so it must not
    keep the harness waiting.

    Blocking (reads ``/proc``, or runs ``ps`` on macOS): call it from a thread.
    """
    if sys.platform.startswith("linux") and os.path.isdir("/proc/self"):
        return [pid for pid, state, group in _proc_states()
                if group == pgid and state not in _FINISHED]
    if sys.platform == "darwin":
        found = []
        for line in _ps(["-A", "-o", "pid=,pgid=,stat="]).splitlines():
            parts = line.split()
            if (len(parts) == 3 and parts[0].isdigit() and parts[1] == str(pgid)
                    and parts[2][:1] not in _FINISHED):
                found.append(int(parts[0]))
        return found
    return None


#: ``/proc/<pid>/stat`` and ``ps`` state letters of a process that has ended.
_FINISHED = frozenset("ZX")


def _every_process() -> list[tuple[int, int]]:
    """Every visible process as (pid, process group): /proc on Linux, ps on macOS."""
    if sys.platform.startswith("linux") and os.path.isdir("/proc/self"):
        return _proc_processes()
    if sys.platform == "darwin":
        return _ps_processes()
    return []


def _proc_processes() -> list[tuple[int, int]]:
    """Every process in ``/proc`` as (pid, process group) (Linux)."""
    return [(pid, group) for pid, _, group in _proc_states()]


def _proc_states() -> list[tuple[int, str, int]]:
    """Every process in ``/proc`` as (pid, state letter, process group) (Linux)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text("utf-8", "replace")
        except OSError:
            continue
        # The command name (field 2) is in parentheses and may hold spaces or ')',
        # so the fields are counted from the last ')': state, ppid, pgrp.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[2].isdigit():
            found.append((int(entry), fields[0], int(fields[2])))
    return found


def _ps_processes() -> list[tuple[int, int]]:
    """Every process ``ps`` lists as (pid, process group) (macOS)."""
    pairs = []
    for line in _ps(["-A", "-o", "pid=,pgid="]).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            pairs.append((int(parts[0]), int(parts[1])))
    return pairs


def _settled_environ(pid: int) -> set[str]:
    """``pid``'s environment, read again while it is empty and the process lives."""
    for attempt in range(ENVIRON_TRIES):
        environ = _proc_environ(pid)
        if environ is None:
            return set()  # gone, or not ours to read
        if environ:
            return environ
        if _proc_state(pid) in (None, *_FINISHED):
            return set()  # gone, or a zombie: no environment will ever show
        # Empty but alive: the kernel shows no environment while a process is
        # between the old image and the new one in execve. Unknown, not "not ours".
        if attempt + 1 < ENVIRON_TRIES:
            time.sleep(ENVIRON_RETRY_S)
    return set()


def _proc_environ(pid: int) -> set[str] | None:
    """The environment ``pid`` was started with (Linux); ``None`` when unreadable."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    return {item.decode("utf-8", "replace") for item in raw.split(b"\0") if item}


def _proc_state(pid: int) -> str | None:
    """``pid``'s state letter from ``/proc/<pid>/stat`` (Linux); ``None`` when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text("utf-8", "replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[0] if fields else None


def _group_members(pgid: int,
                   processes: Callable[[], list[tuple[int, int]]] | None = None) -> list[int]:
    """The pids in process group ``pgid``, the leader first (from ``processes``,
    else :func:`_every_process`)."""
    listed = (processes or _every_process)()
    return [pgid, *(pid for pid, group in listed if group == pgid and pid != pgid)]


def _ps(arguments: list[str]) -> str:
    try:
        result = subprocess.run(
            ["ps", *arguments], capture_output=True, text=True, errors="replace",
            timeout=PS_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return result.stdout if result.returncode == 0 else ""


def _ps_environ(pid: int) -> set[str]:
    """Words of ``pid``'s command line and environment, from ``ps eww`` (macOS).

    ``ps`` prints the environment space-separated after the command, so an entry is
    found as a whole word; a run id has no spaces (§3), so the match is exact.
    """
    return set(_ps(["eww", "-o", "command=", "-p", str(pid)]).split())
