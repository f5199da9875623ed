#!/usr/bin/env python3
"""Idle CPU of a connected harness: without the panel, and with the live panel on a terminal.

Usage: .venv/bin/python scripts/bench_idle.py [--seconds S] [--warmup S] [--quick] [--json]
                                              [--keep]

One ``prohost server`` on 127.0.0.1 (a free port) and, one after the other, two
``prohost agent run --exec cat --brain plain`` harnesses with nothing to do, each
with its own temporary ``$PROHOST_HOME``, paired over HTTP and dialling the server
through ``scripts/bench_e2e.py``'s relay in this process (which passes every frame
on, and says when the harness's first ``status`` and ``heartbeat`` arrived):

1. ``--no-panel``: stdout to /dev/null and stderr to a log file, as under a service
   manager (the plain-log fallback is what runs).
2. The live panel: stdin, stdout and stderr are the slave side of a pseudo-terminal
   of 120×40 cells (``TIOCSWINSZ``) with ``TERM=xterm-256color``; this process reads
   the master side all along (so the harness never blocks on it) and keeps what it
   read in the harness's log file. The panel counts as live only if its first frame
   ("waiting for runs") reached the terminal before the window and more bytes
   reached it during the window; otherwise the figure is an error, not a number.

Each harness is measured once it is connected and settled: its first ``status`` and
``heartbeat`` have reached the relay (and, with the panel, its first frame the
terminal), then ``--warmup`` seconds pass whose CPU is left out. Over the next
``--seconds``, its CPU is utime+stime from ``/proc/<pid>/stat`` (all its threads,
not its children), as a percentage of one CPU over the wall time of the window.
The harness must still be running, on its first connection, at the end.

Every process is started in its own session and stopped on the way out (SIGTERM,
then SIGKILL to its group), also on errors, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import struct
import sys
import termios
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio
from bench_e2e import (
    Child,
    Relay,
    ServerProcess,
    bench_folder,
    cpu_seconds,
    harness_argv,
    harness_healthy,
    log,
    machine,
    pair,
    prohost_server,
    started,
    timed,
    until_sigterm,
)

#: Targets from issue 19, in % of one CPU, at most.
TARGET_NO_PANEL_PCT = 0.2
TARGET_PANEL_PCT = 1.0
#: The pseudo-terminal's size (columns, rows) and type.
TERMINAL_COLUMNS = 120
TERMINAL_ROWS = 40
TERMINAL_TYPE = "xterm-256color"
#: Seconds a harness gets to connect and settle (and draw its first frame).
SETTLE_WITHIN_S = 60.0
#: What the panel of an idle, connected harness says (and the plain log never does).
PANEL_IDLE_TEXT = b"waiting for runs"


class Watcher(Relay):
    """The relay of ``bench_e2e.py``, also counting the harness's heartbeats."""

    def __init__(self, upstream_ws_url: str) -> None:
        super().__init__(upstream_ws_url)
        self.heartbeats = 0

    def _note_from_harness(self, text: str, now: float) -> None:
        if json.loads(text).get("type") == "heartbeat":
            self.heartbeats += 1
        super()._note_from_harness(text, now)


class Terminal:
    """A pseudo-terminal for the harness: :attr:`slave` is its stdin/stdout/stderr;
    :meth:`drain` reads the master side, counting bytes and copying them to a log."""

    def __init__(self, log_path: Path) -> None:
        self.master, self.slave = os.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ,
                    struct.pack("HHHH", TERMINAL_ROWS, TERMINAL_COLUMNS, 0, 0))
        self.log_path = log_path
        self._copy = open(log_path, "ab")  # noqa: SIM115 (closed by drain)
        self.received = 0
        #: The last few KiB read, to look for the panel's text in.
        self.tail = b""
        self._changed = trio.Event()

    async def drain(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read the master side until the harness has closed every copy of the slave
        (then reads fail with EIO) or until cancelled. Cancelled: the master is closed."""
        stream = trio.lowlevel.FdStream(self.master)  # owns (and closes) the master now
        async with stream:
            with self._copy:
                task_status.started()
                while True:
                    try:
                        data = await stream.receive_some()
                    except (OSError, trio.BrokenResourceError):
                        return  # EIO: no process holds the slave any more
                    if not data:
                        return
                    self.received += len(data)
                    self.tail = (self.tail + data)[-8192:]
                    self._copy.write(data)
                    self._changed.set()
                    self._changed = trio.Event()

    async def wait_for(self, text: bytes) -> None:
        """Return once ``text`` is among the last bytes read."""
        while text not in self.tail:
            await self._changed.wait()


def terminal_environment(home: Path) -> dict[str, str]:
    """The harness's environment on the terminal (``home`` made): no size or colour
    overrides, so that it finds the terminal's own, as in a real one."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("PROHOST_") and key not in ("COLUMNS", "LINES", "NO_COLOR")}
    env.update(PROHOST_HOME=str(home), TERM=TERMINAL_TYPE)
    home.mkdir(parents=True, exist_ok=True)
    return env


@asynccontextmanager
async def started_on_terminal(
    argv: list[str], home: Path, terminal: Terminal
) -> AsyncIterator[Child]:
    """``started`` of ``bench_e2e.py``, with the terminal's slave as stdin, stdout
    and stderr and ``TERM`` set; stopped (SIGTERM first) when the block ends."""
    env = terminal_environment(home)
    try:
        proc = await trio.lowlevel.open_process(
            argv, env=env, stdin=terminal.slave, stdout=terminal.slave,
            stderr=terminal.slave, start_new_session=True)
    finally:
        # The harness holds its own copies; once it exits, the master reads EIO.
        os.close(terminal.slave)
    child = Child("harness", proc, terminal.log_path, graceful=True)
    try:
        yield child
    finally:
        await child.stop()


async def idle_harness(
    tmp: Path, server: ServerProcess, client: httpx.AsyncClient, *, panel: bool,
    seconds: float, warmup_s: float,
) -> dict[str, Any]:
    """One harness, connected and idle: its CPU over ``seconds`` after ``warmup_s``;
    see the module docstring."""
    name = "panel" if panel else "no-panel"
    home = tmp / f"harness-{name}"
    argv = harness_argv("cat")
    if panel:
        argv.remove("--no-panel")
    async with trio.open_nursery() as nursery:
        relay = Watcher(server.ws_url)
        await nursery.start(relay.serve)
        await pair(client, server, home, relay.ws_url)
        terminal = Terminal(tmp / f"{home.name}.harness.log") if panel else None
        if terminal is not None:
            await nursery.start(terminal.drain)
            starting = started_on_terminal(argv, home, terminal)
        else:
            starting = started("harness", argv, home)
        async with starting as harness, trio.open_nursery() as inner:
            relay.check = partial(harness_healthy, harness, relay)

            async def watch_exit() -> None:
                await harness.proc.wait()
                relay._poke()

            inner.start_soon(watch_exit)
            with trio.fail_after(SETTLE_WITHIN_S):
                await relay.wait(lambda: relay.status != {} and relay.heartbeats > 0)
                if terminal is not None:
                    await terminal.wait_for(PANEL_IDLE_TEXT)
            log(f"  {name}: connected and settled; {warmup_s:g} s of warm-up, then "
                f"{seconds:g} s measured…")
            await trio.sleep(warmup_s)
            harness_healthy(harness, relay)
            bytes_before = terminal.received if terminal is not None else 0
            cpu_before, began = cpu_seconds(harness.pid), time.monotonic()
            await trio.sleep(seconds)
            cpu_after, ended = cpu_seconds(harness.pid), time.monotonic()
            harness_healthy(harness, relay)
            if relay.connections != 1:
                raise RuntimeError(f"the harness connected {relay.connections} times: "
                                   "it was not idle; see its log in --keep's folder")
            window = ended - began
            result: dict[str, Any] = {
                "panel": panel, "pid": harness.pid, "seconds": window,
                "cpu_s": cpu_after - cpu_before,
                "cpu_pct": (cpu_after - cpu_before) / window * 100,
                "cpu_s_before_window": cpu_before, "heartbeats": relay.heartbeats,
            }
            if terminal is not None:
                written = terminal.received - bytes_before
                if written == 0:
                    raise RuntimeError("the panel wrote nothing to the terminal during the "
                                       "window: it was not live")
                result["terminal_bytes_per_s"] = written / window
            inner.cancel_scope.cancel()
        nursery.cancel_scope.cancel()
    return result


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {"machine": machine(), "settings": {
        "seconds": args.seconds, "warmup_s": args.warmup,
        "terminal": f"{TERMINAL_COLUMNS}x{TERMINAL_ROWS} {TERMINAL_TYPE}"}}
    within = SETTLE_WITHIN_S + args.warmup + args.seconds + 30
    with bench_folder("idle", keep=args.keep) as tmp:
        async with prohost_server(tmp, "server-idle") as server, \
                httpx.AsyncClient(timeout=30) as client:
            for key, panel in (("no_panel", False), ("panel", True)):
                figures[key] = await timed(
                    f"idle harness, {'live panel on a terminal' if panel else '--no-panel'}",
                    within, partial(idle_harness, tmp, server, client, panel=panel,
                                    seconds=args.seconds, warmup_s=args.warmup))
        figures["load_after"] = os.getloadavg()
    return figures


def rows(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per measured harness: its figure against its target."""
    found = []
    for key, what, target in (("no_panel", "idle CPU, --no-panel", TARGET_NO_PANEL_PCT),
                              ("panel", "idle CPU, live panel", TARGET_PANEL_PCT)):
        value = figures.get(key)
        if isinstance(value, dict) and "cpu_pct" in value:
            found.append({"figure": what, "cpu_pct": value["cpu_pct"], "target_pct": target,
                          "met": value["cpu_pct"] <= target})
    return found


def print_report(figures: dict[str, Any], table: list[dict[str, Any]]) -> None:
    m = figures["machine"]
    print(f"Machine: {m['cpus']} × {m['cpu_model']}; Python {m['python']} on {m['platform']}; "
          "load average before " + "/".join(f"{x:.2f}" for x in m["load_avg"])
          + (" after " + "/".join(f"{x:.2f}" for x in figures["load_after"])
             if "load_after" in figures else ""))
    s = figures["settings"]
    print(f"Settings: {s['seconds']:g} s measured after {s['warmup_s']:g} s of warm-up; "
          f"the panel on a {s['terminal']} pseudo-terminal")
    for key in ("no_panel", "panel"):
        value = figures.get(key)
        if isinstance(value, dict) and "error" in value:
            print(f"NOT MEASURED {key}: {value['error']}")
    panel = figures.get("panel", {})
    if "terminal_bytes_per_s" in panel:
        print(f"The panel wrote {panel['terminal_bytes_per_s']:.0f} B/s to the terminal")
    print(f"{'figure':<24} {'% of one CPU':>13}  target")
    for row in table:
        print(f"{row['figure']:<24} {row['cpu_pct']:12.3f}%  ≤ {row['target_pct']:g}% "
              + ("met" if row["met"] else "MISSED"))


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="seconds measured for each harness (default 60)")
    parser.add_argument("--warmup", type=float, default=5.0,
                        help="seconds after it settled whose CPU is left out (default 5)")
    parser.add_argument("--quick", action="store_true",
                        help="a few seconds each, for a smoke check (the figures are coarse: "
                        "the kernel counts CPU in ticks of 10 ms)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary directory (the processes' logs and homes)")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.warmup = 3.0, 1.0
    figures = trio.run(until_sigterm, partial(main_async, args))
    table = rows(figures)
    if args.json:
        figures["rows"] = table
        print(json.dumps(figures, indent=2))
    else:
        print_report(figures, table)
    return 0 if all("error" not in v for v in figures.values() if isinstance(v, dict)) else 1


if __name__ == "__main__":
    sys.exit(main())
