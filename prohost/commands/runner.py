"""``prohost agent stop``, ``agent cancel``, ``agent logs`` and ``agent runs``: the
runner's everyday commands beside a harness, from another shell or a script.

None of them talks to the harness over a socket. ``stop`` finds the harness by the
home's lock (:class:`prohost.home.InstanceLock`: held by the harness, with its pid
in the file) and signals it as Ctrl-C would (§9); ``cancel`` leaves a request in the
home and signals it (:mod:`prohost.engine.supervisor.requests`); ``logs`` reads its rotated log
file; ``runs`` reads the run ledger read-only (:mod:`prohost.engine.ledger.history`)
and the stderr tails kept beside it (:mod:`prohost.engine.agent.stderrtail`).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TextIO

from prohost.commands.status import pid_alive
from prohost.engine.agent.stderrtail import read_tail
from prohost.engine.ledger.history import PastRun, read_history
from prohost.engine.ledger.rows import LedgerError
from prohost.engine.signals import REQUEST_SIGNAL
from prohost.engine.supervisor.requests import answered, ask_cancel, listens
from prohost.engine.view.snapshot import read_snapshot
from prohost.home import GC, LEDGER_FILE, claim_drain, lock_holder
from prohost.invocation import command
from prohost.logfile import log_path

EXIT_OK = 0
#: ``agent stop``: no harness runs on this home; ``agent logs``: no log yet;
#: ``agent runs --show``: no such run.
EXIT_NONE = 1
#: A run id that more than one run of the ledger starts with (each is listed).
EXIT_AMBIGUOUS = 2
#: ``agent stop`` interrupted (Ctrl-C) while it waited: the harness carries on.
EXIT_INTERRUPTED = 130
#: How many of the runs a too-short id matches are listed.
AMBIGUOUS_SHOWN = 10

#: ``agent runs`` without ``--limit``: a screenful, newest first.
DEFAULT_LIMIT = 20
#: How often ``agent logs -f`` looks for new lines (s).
FOLLOW_POLL_S = 0.5
#: How often ``agent stop`` reads the status file while it waits for a drain.
STATUS_POLL_S = 0.1


# --- agent stop ------------------------------------------------------------------------


def _signals_to_send(home: Path, now: bool, pid: int | None = None) -> int:
    """How many SIGTERMs make the harness do what was asked (§9 counts them): one
    drains; ``--now`` is the second, so one more than it has had already, as its
    status file says (a harness already stopping gets none: a third would kill).
    With ``pid``, a drain another ``agent stop`` asked harness ``pid`` for counts as
    its first, even before its status file says so (written at most once a
    second): two drains asked for 50 ms apart are one drain, not a stop."""
    try:
        snapshot = read_snapshot(home)
    except (ValueError, OSError):
        snapshot = None
    connection = None if snapshot is None else snapshot.connection
    if pid is not None and connection not in ("draining", "stopping") \
            and not claim_drain(home, pid):
        connection = "draining"  # asked for already: its signal is on its way
    if not now:
        return 0 if connection in ("draining", "stopping") else 1
    return {"stopping": 0, "draining": 1}.get(connection or "", 2)


def stop_command(home: Path, *, now: bool, out: TextIO | None = None,
                 err: TextIO | None = None) -> int:
    """Signal the harness on ``home`` to drain (``now``: to stop its agents), then
    wait until its process has exited; the exit status (see the module's EXIT_*)."""
    out = out or sys.stdout
    err = err or sys.stderr
    held = lock_holder(home)
    if held is None:
        print(f"No prohost agent is running for {home}.", file=err)
        return EXIT_NONE
    if held.kind == GC:
        print(f"prohost: `{command('agent', 'gc')}` (pid {held.pid}) holds {home}, not "
              "an agent: "
              "it ends by itself once it has removed the worktrees it collects", file=err)
        return EXIT_NONE
    if held.pid is None:
        print(f"prohost: a process holds {held.path} but did not record its pid (its disk "
              f"may have been full as it started), so it cannot be told to stop: `lsof "
              f"{held.path}` shows it; `kill PID` then drains it", file=err)
        return EXIT_NONE
    pid = held.pid
    waiter = _ExitWaiter(pid)
    try:
        # Two different signals: a second one of the same kind sent before the
        # harness has handled the first is merged into it (one pending signal of a
        # kind), and §9 counts SIGINT and SIGTERM alike.
        for signum in (signal.SIGTERM, signal.SIGINT)[:_signals_to_send(home, now, pid)]:
            os.kill(pid, signum)
    except ProcessLookupError:
        waiter.close()
        print(f"prohost agent pid {pid} has exited.", file=out)
        return EXIT_OK
    except PermissionError:
        waiter.close()
        print(f"prohost: the agent on {home} (pid {pid}) belongs to another user: stop it "
              "as that user (or as its service)", file=err)
        return EXIT_NONE
    if now:
        print(f"stopping the running agents of pid {pid} (within 5 s) …", file=out, flush=True)
    else:
        # Said once the harness says so too (its status file, for `agent status`).
        _wait_draining(home, pid, waiter)
        print(f"draining pid {pid}: it finishes the runs in progress and takes no new "
              f"ones; `{command('agent', 'stop', '--now')}` stops them …", file=out, flush=True)
    try:
        waiter.wait()
    except KeyboardInterrupt:
        print(f"\nno longer waiting; pid {pid} carries on "
              f"({'stopping' if now else 'draining'})", file=err)
        return EXIT_INTERRUPTED
    finally:
        waiter.close()
    print(f"prohost agent pid {pid} has exited.", file=out)
    return EXIT_OK


# --- agent cancel ----------------------------------------------------------------------

#: How long ``agent cancel`` waits for the run's end to reach the ledger (an agent
#: gets SIGTERM, then SIGKILL after 5 s; its report is written just after).
CANCEL_SEEN_S = 20.0


def cancel_command(home: Path, typed: str, *, out: TextIO | None = None,
                   err: TextIO | None = None) -> int:
    """Ask the harness on ``home`` to cancel the run ``typed`` names (its id or the
    first characters of it), as a server's cancel would (§6: final, reported
    ``cancelled``, never run again), then wait until its ledger says the run ended;
    the exit status (see the module's EXIT_*)."""
    out = out or sys.stdout
    err = err or sys.stderr
    held = lock_holder(home)
    if held is None or held.kind == GC or held.pid is None:
        # Nothing to ask: a run is only cancelled by the harness that holds it.
        print(f"prohost: no prohost agent is running for {home}, so no run of it is "
              f"running or queued: there is nothing to cancel (`{command('agent', 'runs')}` "
              "shows how its runs ended)", file=err)
        return EXIT_NONE
    found = find_run(home, typed, err)
    if isinstance(found, int):
        return found
    if found.state in ("finished", "reported"):
        print(f"prohost: run {found.run_id} has already ended: {_how_it_ended(found)}; "
              "nothing to cancel", file=err)
        return EXIT_NONE
    try:
        request = ask_cancel(home, found.run_id)
    except OSError as exc:
        print(f"prohost: cannot record the request in {home} ({exc.strerror or exc}); is "
              "the disk full or read-only?", file=err)
        return EXIT_NONE
    if not listens(home, held.pid):
        # Still starting, or a version before `agent cancel`, which the signal would
        # end: the request waits in the home for a harness that reads it.
        print(f"prohost: the agent on {home} (pid {held.pid}) does not read requests yet "
              "(it is starting, or is a version older than `agent cancel`); the request "
              f"to cancel run {found.run_id} is kept, and a harness that reads requests "
              f"obeys it as it starts: restart it (`{command('agent', 'stop')}`, then "
              f"`{command('agent', 'run')}` with its flags), or cancel the run from the "
              "server", file=err)
        return EXIT_NONE
    try:
        os.kill(held.pid, REQUEST_SIGNAL)
    except ProcessLookupError:
        # It ended between the lock and the signal: its next start obeys the request.
        print(f"prohost agent pid {held.pid} has just exited; its next start cancels run "
              f"{found.run_id}", file=out)
        return EXIT_OK
    except PermissionError:
        answered(home, found.run_id)
        print(f"prohost: the agent on {home} (pid {held.pid}) belongs to another user: "
              "cancel the run as that user", file=err)
        return EXIT_NONE
    print(f"cancelling run {found.run_id} …", file=out, flush=True)
    try:
        ended = _wait_ended(home, found.run_id, request)
    except KeyboardInterrupt:
        print(f"\nno longer waiting; the harness cancels run {found.run_id} all the same",
              file=err)
        return EXIT_INTERRUPTED
    if ended is None and request.exists():
        print(f"the harness (pid {held.pid}) has not read the request yet "
              f"(`{command('agent', 'status')}` says whether it is hung); it cancels run "
              f"{found.run_id} when it does, or at its next start", file=out)
    elif ended is None:
        print(f"the harness took the request; run {found.run_id} is still stopping "
              f"(`{command('agent', 'runs', '--show', found.run_id)}` says when it has "
              "ended)", file=out)
    elif ended.error is not None and ended.error.startswith("cancelled: "):
        print(f"run {found.run_id} cancelled (reported so: it is not run again)", file=out)
    else:
        # §6: an agent that had exited with its reply is reported as it finished.
        print(f"run {found.run_id} ended before the cancel reached it: "
              f"{_how_it_ended(ended)}", file=out)
    return EXIT_OK


def _how_it_ended(run: PastRun) -> str:
    if run.ok:
        return "it finished"
    if run.error is None:
        return f"its ledger says {run.state}"
    first = run.error.splitlines()[0] if run.error.strip() else run.error
    return first if first.startswith("cancelled") else f"it failed ({first})"


def _wait_ended(home: Path, run_id: str, request: Path) -> PastRun | None:
    """The run once the ledger says it ended (its outcome in the outbox); ``None``
    when it has not within :data:`CANCEL_SEEN_S`. Read-only, as ``agent runs``."""
    deadline = time.monotonic() + CANCEL_SEEN_S
    while time.monotonic() < deadline:
        try:
            runs = read_history(home / LEDGER_FILE, run_id=run_id)
        except LedgerError:
            runs = []
        if runs and runs[0].state in ("finished", "reported"):
            return runs[0]
        time.sleep(STATUS_POLL_S)  # another process's sqlite file has no "changed" event
    return None


#: How long ``agent stop`` waits for the harness to say it drains before it says
#: so itself (its status file is rewritten within a second of a change).
DRAIN_SEEN_S = 10.0


def _wait_draining(home: Path, pid: int, waiter: _ExitWaiter) -> None:
    """Return once the harness's status file says it drains (or stops), it has
    exited, or :data:`DRAIN_SEEN_S` have passed: ``agent status`` then agrees with
    what ``agent stop`` said."""
    deadline = time.monotonic() + DRAIN_SEEN_S
    while time.monotonic() < deadline and not waiter.exited(STATUS_POLL_S):
        try:
            snapshot = read_snapshot(home)
        except (ValueError, OSError):
            continue
        if snapshot is None or snapshot.pid != pid \
                or snapshot.connection in ("draining", "stopping"):
            return


class _ExitWaiter:
    """Waits for another process to exit: on its pidfd where the kernel has them
    (no polling, no pid reuse), else by the home's lock being released."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fd: int | None = None
        with contextlib.suppress(AttributeError, OSError):
            # Opened before the signal: the pid cannot be reused while we hold it.
            self.fd = os.pidfd_open(pid)

    def wait(self) -> None:
        while not self.exited(None):
            pass

    def exited(self, timeout_s: float | None) -> bool:
        """Whether the process has exited, waiting up to ``timeout_s`` (None: until
        it has)."""
        if self.fd is not None:
            ready, _, _ = select.select([self.fd], [], [], timeout_s)
            return bool(ready)
        # A kernel without pidfds (macOS): look every little while.
        if not pid_alive(self.pid):  # pragma: no cover
            return True
        time.sleep(FOLLOW_POLL_S if timeout_s is None else timeout_s)  # pragma: no cover
        return not pid_alive(self.pid)  # pragma: no cover

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


# --- agent logs ------------------------------------------------------------------------


def logs_command(home: Path, *, follow: bool, lines: int | None = None,
                 out: TextIO | None = None, err: TextIO | None = None,
                 keep_following: Callable[[], bool] = lambda: True) -> int:
    """Print the harness's log file (its last ``lines`` lines); with ``follow``, then
    every line added to it, across rotations, until interrupted."""
    out = out or sys.stdout
    err = err or sys.stderr
    path = log_path(home)
    try:
        handle = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115 - kept open to follow
    except FileNotFoundError:
        print(f"No log yet at {path}: `{command('agent', 'run')}` (and the service) write it "
              "once they start.", file=err)
        return EXIT_NONE
    try:
        text = handle.read()
        shown = text.splitlines(keepends=True)
        if lines is not None:
            shown = shown[-lines:] if lines else []
        out.write("".join(shown))
        out.flush()
        if not follow:
            return EXIT_OK
        try:
            _follow(path, handle, out, keep_following)
        except KeyboardInterrupt:
            return EXIT_OK
        return EXIT_OK
    finally:
        handle.close()


def _follow(path: Path, handle: TextIO, out: TextIO, keep_following: Callable[[], bool]) -> None:
    """Print what is appended to ``path``; when the file is rotated (a new inode at
    that name), finish the old one and go on with the new one from its start. The
    file open when it returns (or raises) is closed here; ``handle`` may be it."""
    inode = os.fstat(handle.fileno()).st_ino
    try:
        while keep_following():
            chunk = handle.read()
            if chunk:
                out.write(chunk)
                out.flush()
                continue
            try:
                current = path.stat().st_ino
            except FileNotFoundError:
                current = inode  # between the rename and the new file: look again
            if current != inode:
                handle.close()
                handle = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115
                inode = os.fstat(handle.fileno()).st_ino
                continue
            time.sleep(FOLLOW_POLL_S)  # a file has no "written to" event on every platform
    finally:
        handle.close()


# --- agent runs ------------------------------------------------------------------------


def runs_command(home: Path, *, as_json: bool, limit: int | None, show: str | None = None,
                 out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Print the run history of ``home``'s ledger, newest first (or one run with
    ``show``); read-only, beside a running harness or without one."""
    out = out or sys.stdout
    err = err or sys.stderr
    if show is not None:
        found = find_run(home, show, err)
        return found if isinstance(found, int) else _show(home, found, as_json=as_json,
                                                          out=out)
    try:
        runs = read_history(home / LEDGER_FILE, limit=limit)
    except LedgerError as exc:
        print(f"prohost: {exc}", file=err)
        return EXIT_NONE
    if as_json:
        out.write(json.dumps([run.to_json() for run in runs], indent=2) + "\n")
        return EXIT_OK
    if not runs:
        print(f"No runs yet in {home / LEDGER_FILE}.", file=out)
        return EXIT_OK
    for run in runs:
        out.write(_run_line(run) + "\n")
    return EXIT_OK


def find_run(home: Path, typed: str, err: TextIO) -> PastRun | int:
    """The run of ``home``'s ledger whose id is ``typed`` or starts with it (with or
    without ``run_``, as git takes a commit's first digits); else the exit status,
    said on ``err``: :data:`EXIT_NONE` for none, :data:`EXIT_AMBIGUOUS` (each
    match listed, newest first) for more than one."""
    typed = typed.strip()
    if not typed:
        print(f"prohost: give a run id (or its first characters); "
              f"`{command('agent', 'runs')}` lists them", file=err)
        return EXIT_NONE
    try:
        exact = read_history(home / LEDGER_FILE, run_id=typed)
        runs = exact or read_history(home / LEDGER_FILE, prefix=typed)
    except LedgerError as exc:
        print(f"prohost: {exc}", file=err)
        return EXIT_NONE
    if not runs:
        print(f"No run {typed!r} in the ledger of {home} (no run id starts with it: it was "
              f"never accepted here, or it was pruned: runs are kept 30 days). "
              f"`{command('agent', 'runs')}` lists them.", file=err)
        return EXIT_NONE
    if len(runs) > 1:
        print(f"prohost: {len(runs)} runs start with {typed!r}; type more of the one you "
              "mean:", file=err)
        for run in runs[:AMBIGUOUS_SHOWN]:
            print(f"  {_run_line(run)}", file=err)
        if len(runs) > AMBIGUOUS_SHOWN:
            print(f"  … and {len(runs) - AMBIGUOUS_SHOWN} more", file=err)
        return EXIT_AMBIGUOUS
    return runs[0]


def _show(home: Path, run: PastRun, *, as_json: bool, out: TextIO) -> int:
    stderr = read_tail(home, run.run_id)
    if as_json:
        document = run.to_json()
        document["stderr"] = stderr
        out.write(json.dumps(document, indent=2) + "\n")
        return EXIT_OK
    out.write(_run_line(run) + "\n")
    out.write(f"accepted  {_when(run.accepted_at)}\n")
    if run.started_at is not None:
        out.write(f"started   {_when(run.started_at)}\n")
    if run.finished_at is not None:
        out.write(f"finished  {_when(run.finished_at)}\n")
    if run.error:
        out.write(f"error     {run.error}\n")
    for checkout in run.checkouts:
        out.write(f"checkout  {checkout.repo}: branch {checkout.branch or '(detached)'}, "
                  f"head {checkout.head or '(none)'}\n")
    if stderr is None:
        out.write("stderr    (none kept)\n")
    else:
        out.write("stderr    (its end, 64 KiB at most):\n")
        out.write(stderr if stderr.endswith("\n") else stderr + "\n")
    return EXIT_OK


def _run_line(run: PastRun) -> str:
    """One run on one line, for reading and for grep: its error's first line only."""
    mark = "·" if run.ok is None else "✓" if run.ok else "✗"
    parts = [mark, _when(run.accepted_at), run.run_id, run.conversation_id or "-", run.state]
    if run.duration_ms is not None:
        parts.append(f"{run.duration_ms / 1000:.1f}s")
    if run.cost_usd is not None:
        parts.append(f"${run.cost_usd:.2f}")
    for checkout in run.checkouts:
        if checkout.branch or checkout.head:
            parts.append(f"{checkout.branch or 'detached'}@{(checkout.head or '')[:10]}")
    if run.error:
        parts.append(run.error.splitlines()[0][:120] if run.error.strip() else run.error)
    return " ".join(parts)


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch).strftime("%Y-%m-%d %H:%M:%S")
