"""``prohost agent status``: what the harness on this home is doing, from its status file.

The running harness rewrites ``$PROHOST_HOME/status.json`` at least every few
seconds and removes it when it exits, so this command never talks to the
harness: it reads the file, checks that the process that wrote it still exists,
and prints the same picture as the live panel.

Exit status: 0 a harness is running and its status is current; 1 none is running
(no file, or its process is gone) or the file is unreadable; 3 the process exists
but has not updated its status for longer than ``STALE_AFTER_S`` (hung?); 4 it is
running but has never connected to its server (still trying: a wrong ``--url``, a
server that is down), so a script that checks the exit status is not told "fine".
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from prohost.engine.view.panel import render
from prohost.engine.view.snapshot import STALE_AFTER_S, STATUS_FILE, Snapshot, read_snapshot
from prohost.engine.view.statustext import compact_duration, human_ago
from prohost.wire.protocol import converter

EXIT_RUNNING = 0
EXIT_NOT_RUNNING = 1
EXIT_STALE = 3
EXIT_NEVER_CONNECTED = 4

def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (it may belong to someone else)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def status_command(
    home: Path,
    *,
    as_json: bool,
    console: Console | None = None,
    error_console: Console | None = None,
    now: float | None = None,
) -> int:
    """Print the status of the harness on ``home``; return the exit status (see the module)."""
    out = console if console is not None else Console()
    err = error_console if error_console is not None else Console(stderr=True)
    try:
        snapshot = read_snapshot(home)
    except (ValueError, OSError) as exc:
        # One line, no traceback: the message names the file (or the OS error does).
        err.print(Text(f"prohost: cannot read the agent status: {exc}"), soft_wrap=True)
        return EXIT_NOT_RUNNING
    current = time.time() if now is None else now
    if snapshot is None:
        if as_json:
            _print_json(out, {"running": False, "age_s": None, "home": str(home)})
        else:
            out.print(Text(f"No prohost agent is running for {home}."), soft_wrap=True)
        return EXIT_NOT_RUNNING
    # A clock step can make a fresh file look written in the future: call that fresh.
    age = max(0.0, current - snapshot.taken_at)
    alive = pid_alive(snapshot.pid)
    if not alive:
        # Whatever the file's age, a harness whose process is gone is not running:
        # it was killed (or crashed) before it could remove its status file.
        if as_json:
            _print_json(out, _json_document(snapshot, running=False, age=age))
        else:
            out.print(Text(
                f"No prohost agent is running for {home} (the last one, pid {snapshot.pid}, "
                f"stopped without cleaning up {human_ago(age)} ago)."
            ), soft_wrap=True)
        return EXIT_NOT_RUNNING
    stale = age > STALE_AFTER_S
    # "connecting" is what a harness shows until its first connection is greeted
    # (the link counts no failures before that: prohost.engine.link.connection).
    fine = EXIT_NEVER_CONNECTED if snapshot.connection == "connecting" else EXIT_RUNNING
    if as_json:
        document = _json_document(snapshot, running=True, age=age)
        document["stale"] = stale
        _print_json(out, document)
        return EXIT_STALE if stale else fine
    if stale:
        out.print(
            f"[bold yellow]⚠ pid {snapshot.pid} has not updated {escape(str(home / STATUS_FILE))}"
            f" for {compact_duration(age)} (hung?); this is its last status:[/]",
            soft_wrap=True,
        )
        # Aging a hung harness's clocks forward would invent progress: show it as it was.
        out.print(render(snapshot))
        return EXIT_STALE
    out.print(render(snapshot, now=current))
    if fine == EXIT_NEVER_CONNECTED:
        err.print(Text("prohost agent status: the agent has not connected to its server "
                       "yet (exit status 4); its log says why"), soft_wrap=True)
    return fine


def _json_document(snapshot: Snapshot, *, running: bool, age: float) -> dict[str, Any]:
    document: dict[str, Any] = {"running": running, "age_s": round(age, 3)}
    document.update(converter.unstructure(snapshot))
    return document


def _print_json(console: Console, document: dict[str, Any]) -> None:
    # out(): no markup, highlighting or wrapping, so a script gets exactly the JSON.
    console.out(json.dumps(document, indent=2), highlight=False)
