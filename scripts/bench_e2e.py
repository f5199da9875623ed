#!/usr/bin/env python3
"""End-to-end benchmark: a real ``prohost server`` and ``prohost agent run`` against floors.

Usage: .venv/bin/python scripts/bench_e2e.py [--runs N] [--probes N] [--queued N]
                                             [--rest-samples N] [--quick] [--json] [--keep]

Everything is measured in one process run, on 127.0.0.1 only, and every figure is
printed as a ratio to a floor (or a budget) taken in the same run:

1. Floors. (a) 16 concurrent ``sh -c cat`` spawns, each fed 4 KiB on stdin, in
   runs/s; (b) 16 concurrent httpx POSTs of 1 KiB to a minimal hypercorn app (trio
   worker, in its own process, as the reference server is), in posts/s; (c)
   floor-pipe, the least that any harness must do per run: in one trio process of
   its own, 16 at a time, ``trio.run_process(["sh", "-c", "cat"])`` with 4 KiB on
   stdin, then an ``httpx.AsyncClient`` POST of its output to the minimal app of (b)
   (in a process of its own); runs/s over the batch, and the client process's CPU
   (``getrusage(RUSAGE_SELF)``: all its threads, not its children) per run, from
   after one uncounted run (its imports and first connection, as the harness's
   start-up is left out of 3). Throughput and CPU are also reported against it.
   (d) floor-ledger: floor-pipe plus the four durable ledger steps docs/protocol.md §7
   asks of a run (accepted with the body, started, the process group, finished),
   each a commit with its fsync, group-committed by one writer thread: no target,
   it shows what part of the gap to floor-pipe durability alone accounts for.
   (e) floor-protocol: floor-ledger plus the rest of what docs/protocol.md asks of a run
   (``bench_protocol_floor.py``): each run arrives as a signed delivery frame from a
   server process (at most 16 unacked), is decoded, checked (HMAC, timestamp),
   recorded and acked; its agent is spawned in a new session; its outcome is POSTed
   with the token and Idempotency-Key; ``reported`` is committed. No target: the
   least any harness of this protocol spends, against which the harness's own part
   is read.
2. Throughput. ``prohost server`` and ``prohost agent run --exec cat --brain plain
   --concurrency 16`` as separate processes, each with its own temporary
   ``$PROHOST_HOME``. ``--runs`` runs, each on its own conversation, are submitted
   over ``POST /v1/runs`` *before* the harness starts; the clock runs from the
   harness's spawn to the last of those completions the server records (the probes
   of 4 run alongside and are not counted: a conservative figure). Against
   min(floor a, floor b).
   The same phase runs again with the least harness in the harness's place:
   floor (e)'s client (``bench_protocol_floor.py``), dialling the same kind of relay
   and server with the paired token and secret, answering pings and sending status
   and heartbeats as §2 asks: runs/s, CPU per run and the probes' acks of the least
   any harness of the protocol does, under the same load, to read the harness's
   against. In both, the machine's CPU per run is split between the harness, its
   agents, the server, this process and the rest (``/proc``, ``getrusage``).
3. The harness's CPU per run: utime+stime from ``/proc/<pid>/stat`` from the moment
   it connected to the last completion of runs and probes (its start-up is left
   out), over runs + probes.
4. Ack latency: once 16 runs of 2 are accepted, ``--probes`` more runs are submitted
   one at a time while the harness works through the backlog; each delivery is timed
   from the moment it is written to the harness's socket to the moment its ack comes
   back. The server's side of the socket is a small relay in this process (the
   harness dials it; it dials the real server and passes every frame through), so
   no hook is needed in the server. The relay lets at most 16 backlog deliveries be
   unacked (a server's delivery window) and sends a probe once none is, so that a
   probe times the harness's ack and not a queue of deliveries ahead of it. The
   figures use the probes acked while the backlog still ran (all of them if none
   was). Against the p99 of a plain trio-websocket echo of a frame of the same size
   plus the p99 of one durable sqlite insert (WAL, synchronous=FULL: a commit with
   its fsync) in the same temporary directory.
5. The harness's RSS (``VmRSS``) with 16 runs busy (``--exec 'sleep 3600'``) and
   ``--queued`` runs queued behind them, bodies of 2 KiB. The runs are submitted
   while the harness is connected (16 + ``--queued`` of them: exactly what fits,
   since the harness answers 503 at 10,000 queued), and the figure is read once it
   has acked them all and its ``status`` says 16 active and ``--queued`` queued.
6. Latency at rest: a harness with ``--concurrency 1`` and nothing queued is sent
   ``--rest-samples`` runs, one at a time, each once the last is settled and a short
   pause has passed (plus one first, not counted: it warms every path). Its agent is
   ``--exec 'printf s >FIFO; cat; printf e >FIFO' --brain plain``: only shell
   built-ins around ``cat``, so ``s`` is the shell's first action and ``e`` is written
   just before it exits; this process reads the fifo and stamps each byte with
   ``time.monotonic()`` as it reads it. (a) Delivery → agent spawned: from the moment
   the relay of 4 writes the delivery frame to the harness to ``s``. (b) Agent exit →
   completion received: from ``e`` to the moment the completion's whole body is in
   at the harness's API base, which is pointed (through the paired credentials'
   ``api_url``) at a small HTTP relay in this process (hypercorn's trio worker): it
   stamps each request, then passes it on to the real server and hands its answer
   back. Floors, one sample each after each run, through the same stamps: (a) a
   bare spawn, ``trio.run_process`` of the same ``/bin/sh -c`` line with the same
   stdin, from the call to ``s``; (b) a bare POST, a warm ``httpx.AsyncClient`` in
   this process posting a body the size of that run's completion to the same HTTP
   relay (answered at once there, as the minimal app is), from the call to the body
   being in: a one-way time, like (b)'s end, not a round trip. p50 and p99 of each
   half against its floor's. Every stamp is taken in this process, so both sides of
   each ratio include the same fifo read and the same wake-ups; the pause between
   runs (REST_PAUSE_S) lets the harness's last ledger step end first. Then, also
   once per run and after the same pause, floor-protocol at rest: floor (e)'s
   client, one run at a time in a process of its own (as the harness is), dialled
   into a WebSocket server in this process, is sent a signed delivery frame for the
   same agent line; from the frame's write to ``s`` (it decodes and checks the
   frame, commits ``accepted``, acks, commits ``started``, spawns), and from ``e``
   to its POST being in at the same HTTP relay (it sees the exit, commits
   ``finished``, POSTs). No target: each half is given against it, and it against
   the bare floors, with what a 2× target leaves once the protocol's steps are made.

Each process is started in its own session and killed (with the agents it spawned)
on the way out (also on Ctrl-C or SIGTERM), whatever happens short of this script
being SIGKILLed. (No parent-death signal: trio starts processes from a worker
thread, and the signal would fire when that thread retires.) Each phase has a
deadline; a phase that fails is reported as not measured and the others still run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import resource
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

import httpx
import trio
import trio_websocket
from bench_protocol_floor import (
    FLOOR_PROTOCOL_CLIENT,
    PROTOCOL_APP,
    SECRET,
    WINDOW,
    DeliverySocket,
    signed_delivery,
)
from bench_rest import FLOOR_PIPE_CLIENT, MINIMAL_APP, Inbox, Marks, agent_command

from prohost.home import Credentials, save_credentials
from prohost.wire.protocol import MAX_MESSAGE_BYTES

#: How many runs execute at once on the harness, and how many tasks drive each floor.
CONCURRENCY = 16
#: Bytes fed to each ``sh -c cat`` of the spawn floor.
SPAWN_STDIN_BYTES = 4096
#: Bytes of each POST body of the HTTP floor.
POST_BYTES = 1024
#: Characters of request text in each run of the RSS phase (its body is a bit more).
QUEUED_TEXT_BYTES = 2048
#: Targets from issue 11.
TARGET_E2E_RATIO = 0.6  # × min(spawn floor, POST floor), at least
TARGET_CPU_MS = 2.5  # ms of harness CPU per run, at most
TARGET_RSS_MIB = 80.0  # MiB with 16 busy and 10,000 queued, at most
#: Targets from issue 19.
TARGET_PIPE_CPU_RATIO = 1.5  # harness CPU per run × floor-pipe's, at most
TARGET_PIPE_RUNS_RATIO = 0.6  # end-to-end runs/s × floor-pipe's, at least
TARGET_ACK_RATIO = 3.0  # × (echo p99 + insert p99), at most (issue 11 had 1.5)
TARGET_REST_RATIO = 2.0  # each half of the latency at rest × its floor, at most
#: Seconds each started process gets to exit after SIGTERM before it is killed.
STOP_GRACE_S = 10.0
#: Seconds between checks of the server for completions once few runs are left;
#: before that the harness's own ``status`` frames say when to look.
FINAL_POLL_S = 0.01
#: Seconds between whole-list checks when the harness says nothing (a safety net).
SAFETY_POLL_S = 2.0
#: Conversations of the ack-latency probes start with this.
PROBE_PREFIX = "probe-"
#: Tries of one ``POST /v1/runs`` that failed in transport.
SUBMIT_ATTEMPTS = 3
#: Backlog deliveries the relay lets be unacked at once (a server's delivery window).
RELAY_WINDOW = 16
#: Connections of the harness to the relay after which the phase gives up.
MAX_RECONNECTS = 5
#: Runs still open at which the completion watcher switches to per-run checks.
FEW_LEFT = 64
#: Seconds the latency phase lets pass after a run is settled before the next: the
#: harness's last ledger step and status frame are done, so the next finds it at rest.
REST_PAUSE_S = 0.05
#: What each run of the latency phase asks (the agent echoes it).
REST_TEXT = "at rest"

def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


# ---------------------------------------------------------------------- processes


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads, not its children), in seconds."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds(pid: int) -> float:
    """cutime + cstime of ``pid``: the CPU of its children it has waited for (a
    harness's agents), in seconds."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds every CPU of the machine has spent not idle (``/proc/stat``: all
    but idle and iowait), since boot."""
    with open("/proc/stat") as stat:
        fields = [int(field) for field in stat.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest is counted in user).
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def cpu_snapshot(harness_pid: int, server_pid: int | None) -> dict[str, float]:
    """CPU seconds so far of the harness, its agents, the server, this process and
    the whole machine: taken twice, their differences say where a run's CPU went."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return {"harness": cpu_seconds(harness_pid),
            "agents": children_cpu_seconds(harness_pid),
            "server": cpu_seconds(server_pid) if server_pid is not None else 0.0,
            "bench": own.ru_utime + own.ru_stime,
            "machine": machine_busy_seconds()}


def memory_kib(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` (peak RSS) of ``pid`` in KiB."""
    found: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0])
    return found


def children_of(pid: int) -> list[int]:
    """Live processes whose parent is ``pid`` (the harness's agents)."""
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(entry))
    return kids


class Child:
    """A process this benchmark started (own session), with its stderr in a file."""

    def __init__(self, name: str, proc: trio.Process, log_path: Path, graceful: bool) -> None:
        self.name = name
        self.graceful = graceful
        self.proc = proc
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    async def stop(self) -> None:
        """SIGTERM (when graceful), then SIGKILL to its group after STOP_GRACE_S; then
        SIGKILL every agent group it had spawned. Cancelled: never returns half done
        (shielded, bounded by 2 × STOP_GRACE_S)."""
        with trio.CancelScope(shield=True):
            if self.proc.returncode is None and self.graceful:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.send_signal(signal.SIGTERM)
                with trio.move_on_after(STOP_GRACE_S):
                    await self.proc.wait()
            agents = []
            if self.proc.returncode is None:
                # Stopped first, it can start no agent while they are listed: a run
                # counted active may not have spawned its agent yet, and one spawned
                # after the listing would outlive the bench (its parent killed).
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.pid, signal.SIGSTOP)
                agents = children_of(self.pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
            with trio.move_on_after(STOP_GRACE_S):
                await self.proc.wait()
            for pid in agents:
                # Each agent leads its own group (start_new_session); the group also
                # holds anything the agent forked.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)


@contextlib.contextmanager
def _log_file(home: Path, path: Path) -> Iterator[BinaryIO]:
    home.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as file:
        yield file


@asynccontextmanager
async def started(
    name: str, argv: list[str], home: Path, *, stdout: int = subprocess.DEVNULL,
    graceful: bool = True,
) -> AsyncIterator[Child]:
    """Start ``argv`` with ``$PROHOST_HOME=home`` in its own session; stop it (and
    its agents) when the block ends: with SIGTERM first when ``graceful``."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PROHOST_")}
    env["PROHOST_HOME"] = str(home)
    log_path = home.parent / f"{home.name}.{name}.log"
    with _log_file(home, log_path) as log_file:
        proc = await trio.lowlevel.open_process(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=log_file,
            start_new_session=True,
        )
    child = Child(name, proc, log_path, graceful)
    try:
        yield child
    finally:
        await child.stop()


# ---------------------------------------------------------------------- floors


async def spawn_floor(count: int) -> float:
    """Runs/s of ``count`` ``sh -c cat`` processes fed 4 KiB, 16 at a time."""
    payload = b"x" * SPAWN_STDIN_BYTES
    left = count

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            result = await trio.run_process(["sh", "-c", "cat"], stdin=payload,
                                            capture_stdout=True)
            if result.stdout != payload:
                raise RuntimeError("sh -c cat did not echo its stdin")

    began = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(CONCURRENCY):
            nursery.start_soon(worker)
    return count / (time.perf_counter() - began)


async def read_lines(
    stream: trio.abc.ReceiveStream, until: Callable[[list[str]], bool], within_s: float, what: str
) -> list[str]:
    """Lines from a child's stdout until ``until(lines)`` holds, or a clear error
    after ``within_s`` (or when the stream ends first)."""
    data = b""
    with trio.move_on_after(within_s):
        while True:
            lines = [line.decode() for line in data.split(b"\n")[:-1]]
            if until(lines):
                return lines
            chunk = await stream.receive_some()
            if not chunk:
                raise RuntimeError(f"{what} exited before it printed what was awaited")
            data += chunk
    raise RuntimeError(f"{what} did not print what was awaited within {within_s:.0f} s")


async def post_floor(count: int, tmp: Path) -> float:
    """Posts/s of ``count`` 1 KiB POSTs, 16 at a time, to the minimal app."""
    async with started("floor-app", [sys.executable, "-c", MINIMAL_APP], tmp / "floor-app",
                       stdout=subprocess.PIPE) as app:
        if app.proc.stdout is None:
            raise RuntimeError("the floor app has no stdout pipe")
        [url] = await read_lines(app.proc.stdout, lambda lines: len(lines) == 1, 30,
                                 "the floor app")
        url += "/complete"
        payload = b"x" * POST_BYTES
        left = count
        async with httpx.AsyncClient() as client:
            await client.post(url, content=payload)  # the connection is warm for both

            async def worker() -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    (await client.post(url, content=payload)).raise_for_status()

            began = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for _ in range(CONCURRENCY):
                    nursery.start_soon(worker)
            return count / (time.perf_counter() - began)


async def floor_pipe(count: int, tmp: Path, *, ledger: bool = False) -> dict[str, Any]:
    """Floor (c), floor-pipe: runs/s and client CPU per run of ``count`` runs of
    ``sh -c cat`` then a POST of its output to the minimal app, 16 at a time; with
    ``ledger``, floor (d), floor-ledger: the same plus the four durable ledger steps
    of a run (see ``FLOOR_PIPE_CLIENT``)."""
    name = "floor-ledger" if ledger else "floor-pipe"
    async with started("floor-app", [sys.executable, "-c", MINIMAL_APP],
                       tmp / "floor-pipe-app", stdout=subprocess.PIPE) as app:
        if app.proc.stdout is None:
            raise RuntimeError("the floor app has no stdout pipe")
        [url] = await read_lines(app.proc.stdout, lambda lines: len(lines) == 1, 30,
                                 "the floor app")
        ledger_file = str(tmp / name / "ledger.sqlite3") if ledger else "-"
        argv = [sys.executable, "-c", FLOOR_PIPE_CLIENT, f"{url}/complete", str(count),
                str(CONCURRENCY), str(SPAWN_STDIN_BYTES), ledger_file]
        async with started(name, argv, tmp / name, stdout=subprocess.PIPE) as client:
            if client.proc.stdout is None:
                raise RuntimeError(f"the {name} client has no stdout pipe")
            try:
                [line] = await read_lines(client.proc.stdout, lambda lines: len(lines) == 1,
                                          math.inf, f"the {name} client")
            except RuntimeError:
                raise RuntimeError(f"the {name} client failed:\n" + client.log_tail()) from None
            result: dict[str, Any] = json.loads(line)
            return result


async def floor_protocol(count: int, tmp: Path) -> dict[str, Any]:
    """Floor (e), floor-protocol: runs/s and client CPU per run of ``count`` runs taken
    off a WebSocket, checked, recorded and acked, then run and reported as
    floor-ledger's are (see :mod:`bench_protocol_floor`)."""
    app_argv = [sys.executable, "-c", PROTOCOL_APP, SECRET, str(WINDOW),
                str(SPAWN_STDIN_BYTES)]
    async with started("protocol-app", app_argv, tmp / "floor-protocol-app",
                       stdout=subprocess.PIPE) as app:
        if app.proc.stdout is None:
            raise RuntimeError("the floor-protocol app has no stdout pipe")
        [url] = await read_lines(app.proc.stdout, lambda lines: len(lines) == 1, 30,
                                 "the floor-protocol app")
        argv = [sys.executable, "-c", FLOOR_PROTOCOL_CLIENT, url, str(count),
                str(CONCURRENCY), SECRET, str(tmp / "floor-protocol" / "ledger.sqlite3")]
        async with started("floor-protocol", argv, tmp / "floor-protocol",
                           stdout=subprocess.PIPE) as client:
            if client.proc.stdout is None:
                raise RuntimeError("the floor-protocol client has no stdout pipe")
            try:
                [line] = await read_lines(client.proc.stdout, lambda lines: len(lines) == 1,
                                          math.inf, "the floor-protocol client")
            except RuntimeError:
                raise RuntimeError("the floor-protocol client failed:\n"
                                   + client.log_tail()) from None
            result: dict[str, Any] = json.loads(line)
            return result


async def echo_round_trips(samples: int, size: int) -> list[float]:
    """Seconds per round trip of a ``size``-character message through a plain
    trio-websocket echo server on loopback (in this process, as the relay is)."""

    async def echo(request: trio_websocket.WebSocketRequest) -> None:
        ws = await request.accept()
        with contextlib.suppress(trio_websocket.ConnectionClosed):
            while True:
                await ws.send_message(await ws.get_message())

    times: list[float] = []
    async with trio.open_nursery() as nursery:
        server = await nursery.start(trio_websocket.serve_websocket, echo, "127.0.0.1", 0, None)
        payload = "x" * size
        async with trio_websocket.open_websocket_url(f"ws://127.0.0.1:{server.port}/") as ws:
            for _ in range(samples):
                began = time.perf_counter()
                await ws.send_message(payload)
                await ws.get_message()
                times.append(time.perf_counter() - began)
        nursery.cancel_scope.cancel()
    return times


def durable_inserts(samples: int, size: int, path: Path) -> list[float]:
    """Seconds per single-row transaction (``BEGIN IMMEDIATE``, insert, ``COMMIT``)
    on a WAL database with ``synchronous=FULL``: the commit fsyncs the log."""
    con = sqlite3.connect(path, isolation_level=None)
    try:
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=FULL")
        con.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY, body TEXT NOT NULL)")
        body = "x" * size
        times: list[float] = []
        for n in range(samples):
            began = time.perf_counter()
            con.execute("BEGIN IMMEDIATE")
            con.execute("INSERT INTO runs VALUES (?, ?)", (f"run_{n}", body))
            con.execute("COMMIT")
            times.append(time.perf_counter() - began)
        return times
    finally:
        con.close()


# ---------------------------------------------------------------------- the relay


class Relay:
    """The server's end of the harness's socket: passes every frame between the
    harness and the real server, and notes when each delivery was written to the
    harness and when its ack came back, and the harness's latest ``status``."""

    def __init__(self, upstream_ws_url: str) -> None:
        self.upstream = upstream_ws_url
        self.port = 0
        self.connections = 0
        self.close_codes: list[int | None] = []
        #: delivery id → (run_id, perf_counter when written to the harness, size).
        self.sent: dict[str, tuple[str, float, int]] = {}
        #: delivery id → (ack status, seconds from write to ack).
        self.acked: dict[str, tuple[int, float]] = {}
        #: run id → time.monotonic() when its latest delivery was written to the harness.
        self.written_at: dict[str, float] = {}
        #: Deliveries written to the harness and not acked yet.
        self.in_flight: set[str] = set()
        #: run ids acked 200 at least once.
        self.accepted: set[str] = set()
        self.status: dict[str, Any] = {}
        self.connected_at: float | None = None  # perf_counter of the first connection
        #: cpu_snapshot() then: the harness's CPU seconds and the rest's.
        self.first_snapshot: dict[str, float] | None = None
        self.server_pid: int | None = None
        self.harness_pid: int | None = None
        #: run id → its latest acked delivery id.
        self.last_ack: dict[str, str] = {}
        #: Called on every wake-up of :meth:`wait`; raises to end the wait (the harness died).
        self.check: Callable[[], None] = lambda: None
        self._changed = trio.Event()

    def _poke(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait(self, predicate: Callable[[], bool], *, check: bool = True) -> None:
        """Return once ``predicate()`` holds, re-checking after every frame."""
        while True:
            if check:
                self.check()
            if predicate():
                return
            await self._changed.wait()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on 127.0.0.1 until cancelled. Cancelled: its connections end."""
        async with trio.open_nursery() as nursery:
            server = await nursery.start(partial(
                trio_websocket.serve_websocket, self._handle, "127.0.0.1", 0, None,
                message_queue_size=64, max_message_size=MAX_MESSAGE_BYTES))
            self.port = server.port
            task_status.started()

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/agent/ws"

    async def _handle(self, request: trio_websocket.WebSocketRequest) -> None:
        self.connections += 1
        if self.connected_at is None:
            self.connected_at = time.perf_counter()
            if self.harness_pid is not None:
                self.first_snapshot = cpu_snapshot(self.harness_pid, self.server_pid)
        headers = [(k, v) for k, v in request.headers
                   if k.lower() in (b"authorization", b"x-prohost-machine", b"x-prohost-agent")]
        down = await request.accept()
        try:
            async with trio_websocket.open_websocket_url(
                self.upstream, extra_headers=headers, message_queue_size=64,
                max_message_size=MAX_MESSAGE_BYTES,
            ) as up, trio.open_nursery() as nursery:

                backlog: deque[tuple[str, str, str]] = deque()
                probes: deque[tuple[str, str, str]] = deque()

                async def from_server() -> None:
                    # Reads ahead, so that a probe is not stuck behind the backlog in
                    # this socket; other frames pass at once, deliveries via the queues.
                    try:
                        while True:
                            text = await up.get_message()
                            frame = json.loads(text) if isinstance(text, str) else {}
                            if frame.get("type") != "delivery":
                                await down.send_message(text)
                                continue
                            body = json.loads(frame["body"])
                            probe = str(body.get("conversation_id")).startswith(PROBE_PREFIX)
                            item = (frame["id"], body.get("run_id", ""), str(text))
                            (probes if probe else backlog).append(item)
                            self._poke()
                    except trio_websocket.ConnectionClosed as closed:
                        code = int(closed.reason.code) if closed.reason else None
                        self.close_codes.append(code)
                        await down.aclose(code or 1000)
                    nursery.cancel_scope.cancel()

                async def to_harness() -> None:
                    # The backlog goes out with at most RELAY_WINDOW deliveries unacked;
                    # a probe goes out once none is, so that it times the harness's ack
                    # and not a queue of deliveries ahead of it in the socket.
                    while True:
                        await self.wait(lambda: (bool(probes) and not self.in_flight) or (
                            not probes and bool(backlog) and len(self.in_flight) < RELAY_WINDOW
                        ), check=False)
                        delivery_id, run_id, text = (probes or backlog).popleft()
                        # Stamped before the write: time in a full socket buffer counts.
                        self.sent[delivery_id] = (run_id, time.perf_counter(), len(text))
                        self.written_at[run_id] = time.monotonic()
                        self.in_flight.add(delivery_id)
                        try:
                            await down.send_message(text)
                        except trio_websocket.ConnectionClosed:
                            nursery.cancel_scope.cancel()
                            return

                async def to_server() -> None:
                    try:
                        while True:
                            text = await down.get_message()
                            if isinstance(text, str):
                                self._note_from_harness(text, time.perf_counter())
                            await up.send_message(text)
                    except trio_websocket.ConnectionClosed as closed:
                        await up.aclose((closed.reason.code if closed.reason else None) or 1000)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(from_server)
                nursery.start_soon(to_harness)
                nursery.start_soon(to_server)
        except (trio_websocket.HandshakeError, OSError) as exc:
            self.close_codes.append(None)
            log(f"relay: cannot reach the server at {self.upstream}: {exc}")
            await down.aclose(1011)
        finally:
            self.in_flight.clear()  # a later connection redelivers them anew
            self._poke()

    def _note_from_harness(self, text: str, now: float) -> None:
        frame = json.loads(text)
        if frame.get("type") == "ack":
            sent = self.sent.get(frame.get("id", ""))
            self.in_flight.discard(frame.get("id", ""))
            if sent is not None:
                self.acked[frame["id"]] = (frame.get("status", 0), now - sent[1])
                self.last_ack[sent[0]] = frame["id"]
                if frame.get("status") == 200:
                    self.accepted.add(sent[0])
        elif frame.get("type") == "status":
            self.status = frame
        self._poke()

    def ack_of(self, run_id: str) -> tuple[int, float] | None:
        """(status, seconds from write to ack) of the latest acked delivery of ``run_id``."""
        delivery_id = self.last_ack.get(run_id)
        return self.acked[delivery_id] if delivery_id else None


# ---------------------------------------------------------------------- server helpers


class ServerProcess:
    """A ``prohost server`` child and what its banner said."""

    def __init__(self, child: Child, http_url: str, ws_url: str, code: str,
                 token_file: Path) -> None:
        self.child = child
        self.http_url = http_url
        self.ws_url = ws_url
        self.code = code
        #: What submitting a run needs (the server wrote it; its banner says where).
        self.api_headers = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        #: The token and secret of the first pairing: a pairing code works once
        #: (docs/protocol.md §10), so later harnesses of the same run, one at a time,
        #: get the same credentials.
        self.paired: tuple[str, str] | None = None


@asynccontextmanager
async def prohost_server(tmp: Path, name: str) -> AsyncIterator[ServerProcess]:
    """``prohost server`` on 127.0.0.1, a free port; stopped when the block ends."""
    argv = [sys.executable, "-m", "prohost", "server", "--host", "127.0.0.1", "--port", "0",
            "--no-state"]
    async with started("server", argv, tmp / name, stdout=subprocess.PIPE) as child:
        if child.proc.stdout is None:
            raise RuntimeError("the server has no stdout pipe")
        lines = await read_lines(child.proc.stdout,
                                 lambda lines: any("HTTP:" in line for line in lines), 30,
                                 "prohost server")
        banner = {}
        for line in lines:
            key, _, value = line.strip().partition(":")
            banner[key.strip()] = value.strip()
        # The rest of the banner is not read; it is a few lines, far below a pipe's size.
        yield ServerProcess(child, banner["HTTP"], banner["WebSocket"], banner["pairing code"],
                            Path(banner["API token"].split()[0]))


async def pair(
    client: httpx.AsyncClient, server: ServerProcess, home: Path, ws_url: str,
    api_url: str | None = None,
) -> tuple[str, str]:
    """Pair over HTTP as ``prohost agent pair`` would, but save ``ws_url`` (the relay)
    as the socket to dial; results go to ``api_url`` if given, else straight to the
    server's. Returns the token and the secret. The code works once: a second home
    paired with the same server gets the first pairing's credentials."""
    if server.paired is None:
        answer = await client.post(f"{server.http_url}/v1/agent/pair",
                                   json={"code": server.code, "machine": "bench"})
        answer.raise_for_status()
        data = answer.json()
        server.paired = (data["token"], data["secret"])
    token, secret = server.paired
    save_credentials(home, Credentials(token=token, secret=secret,
                                       ws_url=ws_url, api_url=api_url or server.http_url))
    return token, secret


async def submit_runs(
    client: httpx.AsyncClient, server: ServerProcess, texts: list[tuple[str, str]]
) -> list[str]:
    """``POST /v1/runs`` for each (conversation, text), 16 at a time; the run ids in
    order. Each run's id is named (``run-<conversation>``) so that a POST lost to a
    closing keep-alive connection can be sent again: a 409 then means it arrived."""
    run_ids = [f"run-{conversation}" for conversation, _ in texts]
    next_index = 0

    async def post(index: int) -> None:
        conversation, text = texts[index]
        payload = {"conversation_id": conversation, "text": text, "run_id": run_ids[index]}
        for attempt in range(SUBMIT_ATTEMPTS):
            try:
                answer = await client.post(f"{server.http_url}/v1/runs", json=payload,
                                           headers=server.api_headers)
            except httpx.TransportError:
                if attempt + 1 == SUBMIT_ATTEMPTS:
                    raise
                continue
            if answer.status_code == 409 and attempt > 0:
                return
            answer.raise_for_status()
            return

    async def worker() -> None:
        nonlocal next_index
        while next_index < len(texts):
            next_index += 1
            await post(next_index - 1)

    async with trio.open_nursery() as nursery:
        for _ in range(CONCURRENCY):
            nursery.start_soon(worker)
    return run_ids


FINAL_STATES = frozenset({"completed", "failed", "cancelled", "closed"})


async def wait_completed(
    client: httpx.AsyncClient, server: ServerProcess, relay: Relay, run_ids: list[str]
) -> float:
    """Wait until every run in ``run_ids`` is in a final state on the server; return
    the perf_counter at which the last was seen final.

    Cheap on the server, which shares the machine: while the harness's ``status``
    says runs are queued, nothing is asked but a whole list every SAFETY_POLL_S (a
    safety net); once nothing is queued, one whole list, then only the oldest open
    run every FINAL_POLL_S (runs finish about in order; when it is final the next is
    asked at once). ``relay.check`` ends the wait with an error if the harness died."""
    open_ = list(run_ids)
    last_whole = -math.inf

    def quiet() -> bool:
        return bool(relay.status.get("queued", 1) == 0)

    while True:
        relay.check()
        if quiet() or time.perf_counter() - last_whole > SAFETY_POLL_S:
            if len(open_) > FEW_LEFT or last_whole == -math.inf:
                listing = (await client.get(f"{server.http_url}/v1/runs")).json()["runs"]
                final = {v["run_id"] for v in listing if v["state"] in FINAL_STATES}
                open_ = [r for r in open_ if r not in final]
                last_whole = time.perf_counter()
            while open_:
                view = (await client.get(f"{server.http_url}/v1/runs/{open_[0]}")).json()
                if view.get("state") not in FINAL_STATES:
                    break
                open_.pop(0)
            if not open_:
                return time.perf_counter()
        if quiet() and len(open_) <= FEW_LEFT:
            await trio.sleep(FINAL_POLL_S)
        else:
            # Wake on the harness's next status (at most one per 250 ms) or the net.
            seen = relay.status
            with trio.move_on_after(SAFETY_POLL_S):
                await relay.wait(lambda: relay.status is not seen)  # noqa: B023 (awaited here)


def harness_healthy(harness: Child, relay: Relay) -> None:
    """Raise if the harness has exited, or the server keeps dropping it."""
    if harness.proc.returncode is not None:
        raise RuntimeError(f"the harness exited with {harness.proc.returncode}:\n"
                           + harness.log_tail())
    if relay.connections > MAX_RECONNECTS:
        raise RuntimeError(
            f"the server dropped the harness {len(relay.close_codes)} times (close codes "
            f"{relay.close_codes[-3:]}): a server that pushes every waiting run at once "
            "overflows its 1,024-frame outbox and drops the connection (issue 11); use "
            "fewer --runs / --queued, or a server with a delivery window")


def harness_argv(exec_command: str, concurrency: int = CONCURRENCY) -> list[str]:
    return [sys.executable, "-m", "prohost", "agent", "run", "--exec", exec_command,
            "--brain", "plain", "--concurrency", str(concurrency), "--machine", "bench",
            "--no-panel"]


# ---------------------------------------------------------------------- phases 2–4


async def throughput_and_acks(tmp: Path, runs: int, probes: int, *,
                              least: bool = False) -> dict[str, Any]:
    """Phases 2, 3 and 4 in one go; see the module docstring. ``least``: the same
    with floor-protocol's client, the least harness, in the harness's place."""
    result: dict[str, Any] = {"runs": runs, "probes": probes}
    name = "least-e2e" if least else "harness-e2e"
    async with prohost_server(tmp, f"server-{name}") as server, \
            httpx.AsyncClient(timeout=30) as client, trio.open_nursery() as nursery:
        relay = Relay(server.ws_url)
        relay.server_pid = server.child.pid
        await nursery.start(relay.serve)
        home = tmp / name
        token, secret = await pair(client, server, home, relay.ws_url)
        argv = harness_argv("cat")
        if least:
            argv = [sys.executable, "-c", FLOOR_PROTOCOL_CLIENT, server.http_url, "0",
                    str(CONCURRENCY), secret, str(home / "ledger.sqlite3"), relay.ws_url, "cat",
                    token]
        log(f"  submitting {runs} runs before the harness starts…")
        run_ids = await submit_runs(client, server,
                                    [(f"bench-{n}", f"bench run {n}") for n in range(runs)])
        probe_ids: list[str] = []
        probe_times: list[float] = []
        busy_times: list[float] = []  # of the probes acked while the backlog ran
        backlog_done = trio.Event()
        began = time.perf_counter()
        async with started("least harness" if least else "harness", argv, home) as harness:
            relay.harness_pid = harness.pid

            relay.check = partial(harness_healthy, harness, relay)

            async def watch_exit() -> None:
                await harness.proc.wait()
                relay._poke()

            async def send_probes(*, task_status: trio.TaskStatus[None]) -> None:
                task_status.started()
                wanted = set(run_ids)
                # Once the first runs are executing; the rest of the backlog is then
                # still being accepted and run.
                await relay.wait(lambda: len(relay.accepted & wanted) >= min(runs, CONCURRENCY))
                result["probes_from_s"] = time.perf_counter() - began
                log(f"  probing from {result['probes_from_s']:.2f} s: {probes} deliveries, "
                    "one at a time…")
                for n in range(probes):
                    [run_id] = await submit_runs(client, server,
                                                 [(f"{PROBE_PREFIX}{n}", "probe")])
                    probe_ids.append(run_id)
                    def acked(run_id: str = run_id) -> bool:
                        return relay.ack_of(run_id) is not None

                    await relay.wait(acked)
                    status, seconds = relay.ack_of(run_id) or (0, 0.0)
                    if status != 200:
                        raise RuntimeError(f"probe {run_id} was acked {status}, not 200")
                    probe_times.append(seconds)
                    if not backlog_done.is_set():
                        busy_times.append(seconds)

            async with trio.open_nursery() as inner:
                inner.start_soon(watch_exit)
                await inner.start(send_probes)
                backlog_ended = await wait_completed(client, server, relay, run_ids)
                backlog_done.set()
                log(f"  the {runs} runs completed after {backlog_ended - began:.2f} s")
                await relay.wait(lambda: len(probe_times) == probes)
                ended = await wait_completed(client, server, relay, run_ids + probe_ids)
                snapshot_end = cpu_snapshot(harness.pid, server.child.pid)
                inner.cancel_scope.cancel()
        listing = (await client.get(f"{server.http_url}/v1/runs")).json()["runs"]
        nursery.cancel_scope.cancel()
    states: dict[str, int] = {}
    for view in listing:
        states[view["state"]] = states.get(view["state"], 0) + 1
    total = runs + len(probe_ids)
    probe_set = set(probe_ids)
    sizes = [size for (run, _, size) in relay.sent.values() if run in probe_set]
    first = relay.first_snapshot or {}
    per_run = {key: (snapshot_end[key] - first.get(key, 0.0)) * 1e3 / total
               for key in snapshot_end}
    result.update(
        cpu_ms_per_run=per_run["harness"],
        states=states,
        seconds=ended - began,
        # The backlog alone, though the probes ran alongside: a conservative figure.
        runs_per_s=runs / (backlog_ended - began),
        backlog_seconds=backlog_ended - began,
        backlog_seconds_from_connect=backlog_ended - (relay.connected_at or began),
        connections=relay.connections,
        close_codes=relay.close_codes,
        cpu_ms_startup=first.get("harness", 0.0) * 1e3,
        # Where the machine's CPU went over the same window, per run: the harness, its
        # agents, the reference server, this process (relay and submitter), and the
        # whole machine (the rest is the kernel's and other processes').
        cpu_ms_per_run_of=per_run,
        # Under load means while the backlog ran; all of them if none was.
        ack_samples=busy_times or probe_times,
        ack_samples_all=probe_times,
        acked_while_busy=len(busy_times),
        delivery_bytes=round(statistics.fmean(sizes)) if sizes else 600,
    )
    return result


# ---------------------------------------------------------------------- phase 5


async def rss_with_queue(tmp: Path, queued: int) -> dict[str, Any]:
    """Phase 5: the harness's RSS with 16 busy and ``queued`` queued."""
    async with prohost_server(tmp, "server-rss") as server, \
            httpx.AsyncClient(timeout=60) as client, trio.open_nursery() as nursery:
        relay = Relay(server.ws_url)
        await nursery.start(relay.serve)
        home = tmp / "harness-rss"
        await pair(client, server, home, relay.ws_url)
        # Killed outright at the end: a drain would first report the whole queue.
        async with started("harness", harness_argv("sleep 3600"), home,
                           graceful=False) as harness, trio.open_nursery() as inner:
            relay.check = partial(harness_healthy, harness, relay)

            async def watch_exit() -> None:
                await harness.proc.wait()
                relay._poke()

            inner.start_soon(watch_exit)
            await relay.wait(lambda: relay.status != {})
            idle = memory_kib(harness.pid)
            total = CONCURRENCY + queued
            log(f"  submitting {total} runs of {QUEUED_TEXT_BYTES} B while it is connected…")
            text = "q" * QUEUED_TEXT_BYTES
            run_ids = await submit_runs(client, server,
                                        [(f"rss-{n}", text) for n in range(total)])
            wanted = set(run_ids)
            await relay.wait(lambda: len(relay.accepted & wanted) == total
                             and relay.status.get("active") == CONCURRENCY
                             and relay.status.get("queued") == queued)
            memory = memory_kib(harness.pid)
            busy = relay.status.get("active")
            inner.cancel_scope.cancel()
        nursery.cancel_scope.cancel()
    return {"queued": queued, "active": busy, "rss_kib": memory["VmRSS"],
            "peak_kib": memory["VmHWM"], "idle_rss_kib": idle["VmRSS"]}


# ---------------------------------------------------------------------- phase 6


async def latency_at_rest(tmp: Path, samples: int) -> dict[str, Any]:
    """Phase 6: the two halves of a run's latency at rest and their floors, in
    seconds (one list each, sample by sample); see the module docstring."""
    marks = Marks(tmp / "rest.fifo")
    agent = agent_command(marks.path)
    figures: dict[str, list[float]] = {
        "spawned": [], "spawn_floor": [], "reported": [], "post_floor": [],
        "spawn_protocol_floor": [], "post_protocol_floor": []}
    async with prohost_server(tmp, "server-rest") as server, \
            httpx.AsyncClient(timeout=30) as client, \
            httpx.AsyncClient(timeout=30) as poster, trio.open_nursery() as nursery:
        relay = Relay(server.ws_url)
        await nursery.start(relay.serve)
        inbox = Inbox(server.http_url, client)
        await nursery.start(inbox.serve)
        await nursery.start(marks.read)
        deliveries = DeliverySocket()
        await nursery.start(deliveries.serve)
        home = tmp / "harness-rest"
        await pair(client, server, home, relay.ws_url, api_url=inbox.url)
        # floor-protocol at rest: its client runs one uncounted run of its own first.
        least_argv = [sys.executable, "-c", FLOOR_PROTOCOL_CLIENT, inbox.url, str(samples + 1),
                      "1", SECRET, str(tmp / "floor-protocol-rest" / "ledger.sqlite3"),
                      deliveries.url, agent]
        # The agent writes its marks into the fifo: a confined run (the default,
        # docs/protocol.md §13) may, because the harness names it (--allow-write).
        rest_argv = [*harness_argv(agent, concurrency=1), "--allow-write", str(marks.path)]
        async with started("harness", rest_argv, home) as harness, \
                started("floor-protocol", least_argv, tmp / "floor-protocol-rest") as least, \
                trio.open_nursery() as inner:
            relay.check = partial(harness_healthy, harness, relay)

            async def watch_least() -> None:
                # It ends by itself after its last run; failing, it would leave a
                # sample waiting for marks that never come.
                if await least.proc.wait():
                    raise RuntimeError("the floor-protocol client failed:\n" + least.log_tail())

            inner.start_soon(watch_least)
            # Its uncounted run, answered at once (not timed: its marks are skipped).
            await deliveries.send(signed_delivery("dlv-warm", "floor-protocol-warm", REST_TEXT,
                                                  "/floor"))
            await inbox.wait_arrived("floor-protocol-warm")

            async def watch_exit() -> None:
                await harness.proc.wait()
                raise RuntimeError(f"the harness exited with {harness.proc.returncode}:\n"
                                   + harness.log_tail())

            inner.start_soon(watch_exit)
            await relay.wait(lambda: relay.status != {})
            for n in range(samples + 1):  # the first warms every path up: not counted
                mark = len(marks.events)
                [run_id] = await submit_runs(client, server, [(f"rest-{n}", REST_TEXT)])
                await inbox.wait_answered(run_id)
                spawned = await marks.first("s", mark) - relay.written_at[run_id]
                reported = inbox.arrived[run_id] - await marks.first("e", mark)
                # The floors, through the same stamps.
                mark = len(marks.events)
                began = time.monotonic()
                await trio.run_process(["/bin/sh", "-c", agent], stdin=REST_TEXT.encode(),
                                       capture_stdout=True, start_new_session=True)
                spawn_floor = await marks.first("s", mark) - began
                began = time.monotonic()
                (await poster.post(f"{inbox.url}/floor", content=b"x" * inbox.sizes[run_id],
                                   headers={"Idempotency-Key": f"floor-{n}"})).raise_for_status()
                post_floor = inbox.arrived[f"floor-{n}"] - began
                # floor-protocol at rest, after the same pause as a run and through the
                # same stamps: the least any harness of docs/protocol.md does for this run,
                # in a process of its own.
                await trio.sleep(REST_PAUSE_S)
                mark = len(marks.events)
                least_id = f"floor-protocol-{n}"
                began = time.monotonic()
                await deliveries.send(signed_delivery(f"dlv-{n}", least_id, REST_TEXT, "/floor"))
                spawn_protocol_floor = await marks.first("s", mark) - began
                await inbox.wait_arrived(least_id)
                post_protocol_floor = inbox.arrived[least_id] - await marks.first("e", mark)
                if n:
                    figures["spawned"].append(spawned)
                    figures["reported"].append(reported)
                    figures["spawn_floor"].append(spawn_floor)
                    figures["post_floor"].append(post_floor)
                    figures["spawn_protocol_floor"].append(spawn_protocol_floor)
                    figures["post_protocol_floor"].append(post_protocol_floor)
                await trio.sleep(REST_PAUSE_S)
            states = {(await client.get(f"{server.http_url}/v1/runs/run-rest-{n}")).json()
                      .get("state") for n in range(samples + 1)}
            if states != {"completed"}:
                raise RuntimeError(f"the server has the latency runs in states {states}")
            inner.cancel_scope.cancel()
        nursery.cancel_scope.cancel()
    sizes = [inbox.sizes[f"run-rest-{n}"] for n in range(samples + 1)]
    return {"samples": samples, "completion_bytes": statistics.fmean(sizes), **figures}


# ---------------------------------------------------------------------- report


def machine() -> dict[str, Any]:
    model = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    fs = "?"
    tmp = os.path.realpath(tempfile.gettempdir())
    with contextlib.suppress(OSError), open("/proc/mounts") as mounts:
        best = ""
        for line in mounts:
            parts = line.split()
            if tmp.startswith(parts[1]) and len(parts[1]) > len(best):
                best, fs = parts[1], parts[2]
    return {"cpus": os.cpu_count(), "cpu_model": model, "python": platform.python_version(),
            "platform": platform.platform(), "tmp_dir": tmp, "tmp_fs": fs,
            "load_avg": os.getloadavg()}


@contextlib.contextmanager
def bench_folder(name: str, *, keep: bool) -> Iterator[Path]:
    """A temporary folder for one bench run's homes and logs, removed afterwards
    unless ``keep`` (then its path is printed)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"prohost-bench-{name}-"))
    if keep:
        log(f"logs and homes stay in {tmp}")
    try:
        yield tmp
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)


async def timed(what: str, within_s: float, phase: Callable[[], Awaitable[Any]]) -> Any:
    """Run one phase under its deadline; its failure becomes an ``{"error": …}``."""
    log(f"{what}…")
    try:
        with trio.fail_after(within_s):
            return await phase()
    except trio.TooSlowError:
        return {"error": f"{what} did not finish within {within_s:.0f} s"}
    except Exception as exc:  # one phase failing must not hide the others' figures
        traceback.print_exc()
        while isinstance(exc, ExceptionGroup):  # the first cause says it (they agree)
            exc = exc.exceptions[0]
        return {"error": f"{what} failed: {type(exc).__name__}: {exc}"}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {"machine": machine(), "settings": {
        "runs": args.runs, "probes": args.probes, "queued": args.queued,
        "floor_samples": args.floor_samples, "rest_samples": args.rest_samples}}
    with bench_folder("e2e", keep=args.keep) as tmp:
        figures["spawn_floor"] = await timed(
            "floor (a): sh -c cat", args.phase_s, lambda: spawn_floor(args.floor_samples))
        figures["post_floor"] = await timed(
            "floor (b): httpx POST to hypercorn", args.phase_s,
            lambda: post_floor(args.floor_samples, tmp))
        figures["floor_pipe"] = await timed(
            "floor (c): floor-pipe, sh -c cat then httpx POST", args.phase_s,
            lambda: floor_pipe(args.floor_samples, tmp))
        figures["floor_ledger"] = await timed(
            "floor (d): floor-ledger, floor-pipe plus a run's four durable ledger steps",
            args.phase_s, lambda: floor_pipe(args.floor_samples, tmp, ledger=True))
        figures["floor_protocol"] = await timed(
            "floor (e): floor-protocol, floor-ledger plus a WebSocket delivery and its ack",
            args.phase_s, lambda: floor_protocol(args.floor_samples, tmp))
        e2e = await timed("end to end: server + harness, then probes", args.phase_s * 4,
                          lambda: throughput_and_acks(tmp, args.runs, args.probes))
        figures["e2e"] = e2e
        figures["e2e_least"] = await timed(
            "end to end with the least harness (floor-protocol's client) in its place",
            args.phase_s * 4,
            lambda: throughput_and_acks(tmp, args.runs, args.probes, least=True))
        size = e2e.get("delivery_bytes", 600)
        figures["echo"] = await timed("WebSocket echo", args.phase_s,
                                      lambda: echo_round_trips(args.probes, size))
        figures["insert"] = await timed(
            "durable sqlite insert", args.phase_s,
            lambda: trio.to_thread.run_sync(durable_inserts, args.probes, size,
                                            tmp / "insert.sqlite3"))
        figures["rss"] = await timed("RSS with a full queue", args.phase_s * 4,
                                     lambda: rss_with_queue(tmp, args.queued))
        figures["rest"] = await timed("latency at rest: concurrency 1, nothing queued",
                                      args.phase_s * 4,
                                      lambda: latency_at_rest(tmp, args.rest_samples))
        figures["load_after"] = os.getloadavg()
    return figures


def ratios(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per figure: measured, against what, the ratio and its target."""
    rows: list[dict[str, Any]] = []

    def ok(key: str) -> bool:
        value = figures.get(key)
        return value is not None and not (isinstance(value, dict) and "error" in value)

    e2e = figures["e2e"]
    if ok("e2e") and ok("spawn_floor") and ok("post_floor"):
        floor = min(figures["spawn_floor"], figures["post_floor"])
        ratio = e2e["runs_per_s"] / floor
        rows.append({"figure": "end-to-end runs/s", "measured": f"{e2e['runs_per_s']:.0f}/s",
                     "against": f"min(spawn {figures['spawn_floor']:.0f}/s, "
                     f"POST {figures['post_floor']:.0f}/s)",
                     "ratio": ratio, "target": f">= {TARGET_E2E_RATIO}",
                     "met": ratio >= TARGET_E2E_RATIO})
    if ok("e2e") and ok("floor_pipe"):
        pipe = figures["floor_pipe"]
        ratio = e2e["runs_per_s"] / pipe["runs_per_s"]
        rows.append({"figure": "end-to-end runs/s vs floor-pipe",
                     "measured": f"{e2e['runs_per_s']:.0f}/s",
                     "against": f"floor-pipe {pipe['runs_per_s']:.0f}/s", "ratio": ratio,
                     "target": f">= {TARGET_PIPE_RUNS_RATIO}",
                     "met": ratio >= TARGET_PIPE_RUNS_RATIO})
        cpu = e2e["cpu_ms_per_run"]
        ratio = cpu / pipe["cpu_ms_per_run"]
        rows.append({"figure": "harness CPU per run vs floor-pipe",
                     "measured": f"{cpu:.2f} ms",
                     "against": f"floor-pipe {pipe['cpu_ms_per_run']:.2f} ms", "ratio": ratio,
                     "target": f"<= {TARGET_PIPE_CPU_RATIO}",
                     "met": ratio <= TARGET_PIPE_CPU_RATIO})
    if ok("e2e") and ok("floor_pipe") and "cpu_ms_per_run_of" in e2e \
            and "machine_cpu_ms_per_run" in figures["floor_pipe"]:
        # No target: the machine's CPU per run (both CPUs, every process), which bounds
        # runs/s once the machine is busy; the e2e side includes the reference server
        # and this process's relay, which floor-pipe's minimal app does not.
        machine_ms = e2e["cpu_ms_per_run_of"]["machine"]
        pipe_ms = figures["floor_pipe"]["machine_cpu_ms_per_run"]
        rows.append({"figure": "machine CPU per run vs floor-pipe",
                     "measured": f"{machine_ms:.2f} ms", "against": f"floor-pipe {pipe_ms:.2f} ms",
                     "ratio": machine_ms / pipe_ms, "target": "-", "met": None})
    # No target for these: floor-ledger says how much of the gap to floor-pipe the
    # ledger's durability (§7) accounts for, floor-protocol all that docs/protocol.md asks
    # of a run (neither has anything of prohost in it), and the least harness end to
    # end is that in the harness's place (the same server, relay, runs, probes, load).
    for floor_key, name, short in (("floor_ledger", "floor-ledger", "floor-ledger"),
                                   ("floor_protocol", "floor-protocol", "floor-protocol"),
                                   ("e2e_least", "the least harness, end to end",
                                    "least harness")):
        if not (ok("e2e") and ok(floor_key)):
            continue
        floor = figures[floor_key]
        for label, key, unit in (("runs/s", "runs_per_s", "/s"),
                                 ("CPU per run", "cpu_ms_per_run", " ms")):
            rows.append({"figure": f"harness {label} vs {name}",
                         "measured": f"{e2e[key]:.2f}{unit}",
                         "against": f"{short} {floor[key]:.2f}{unit}",
                         "ratio": e2e[key] / floor[key], "target": "-", "met": None})
    if ok("floor_pipe") and ok("floor_protocol"):
        pipe, least = figures["floor_pipe"], figures["floor_protocol"]
        ratio = least["cpu_ms_per_run"] / pipe["cpu_ms_per_run"]
        room = TARGET_PIPE_CPU_RATIO * pipe["cpu_ms_per_run"] - least["cpu_ms_per_run"]
        rows.append({"figure": "floor-protocol CPU per run vs floor-pipe",
                     "measured": f"{least['cpu_ms_per_run']:.2f} ms",
                     "against": f"floor-pipe {pipe['cpu_ms_per_run']:.2f} ms", "ratio": ratio,
                     "target": f"(<= {TARGET_PIPE_CPU_RATIO} leaves the harness "
                     f"{max(0.0, room):.2f} ms)", "met": None})
    if ok("e2e") and ok("e2e_least"):
        least = figures["e2e_least"]
        if e2e["ack_samples"] and least["ack_samples"]:
            for label, fraction in (("p50", 0.50), ("p99", 0.99)):
                ack = percentile(e2e["ack_samples"], fraction) * 1e3
                floor = percentile(least["ack_samples"], fraction) * 1e3
                rows.append({"figure": f"ack {label} vs the least harness's",
                             "measured": f"{ack:.2f} ms",
                             "against": f"least harness {label} {floor:.2f} ms",
                             "ratio": ack / floor, "target": "-", "met": None})
    if ok("e2e_least") and ok("floor_pipe"):
        # What the runs/s target asks of the harness, given what the least harness
        # reaches in its place.
        least, pipe = figures["e2e_least"], figures["floor_pipe"]
        ratio = least["runs_per_s"] / pipe["runs_per_s"]
        needed = TARGET_PIPE_RUNS_RATIO / ratio
        rows.append({"figure": "least harness runs/s, end to end, vs floor-pipe",
                     "measured": f"{least['runs_per_s']:.0f}/s",
                     "against": f"floor-pipe {pipe['runs_per_s']:.0f}/s", "ratio": ratio,
                     "target": f"(>= {TARGET_PIPE_RUNS_RATIO} needs the harness at "
                     f"{needed:.2f}× its runs/s)", "met": None})
    if ok("e2e"):
        cpu = e2e["cpu_ms_per_run"]
        rows.append({"figure": "harness CPU per run", "measured": f"{cpu:.2f} ms",
                     "against": f"budget {TARGET_CPU_MS} ms", "ratio": cpu / TARGET_CPU_MS,
                     "target": "<= 1.0", "met": cpu <= TARGET_CPU_MS})
    if ok("e2e") and ok("echo") and ok("insert") and e2e["ack_samples"]:
        acks, echo, insert = e2e["ack_samples"], figures["echo"], figures["insert"]
        for label, fraction in (("p50", 0.50), ("p99", 0.99)):
            ack = percentile(acks, fraction) * 1e3
            floor = (percentile(echo, fraction) + percentile(insert, fraction)) * 1e3
            rows.append({"figure": f"ack {label}", "measured": f"{ack:.2f} ms",
                         "against": f"echo {percentile(echo, fraction) * 1e3:.2f} + insert "
                         f"{percentile(insert, fraction) * 1e3:.2f} ms",
                         "ratio": ack / floor,
                         "target": f"<= {TARGET_ACK_RATIO}" if label == "p99" else "-",
                         "met": ack / floor <= TARGET_ACK_RATIO if label == "p99" else None})
    if ok("rss"):
        mib = figures["rss"]["rss_kib"] / 1024
        rows.append({"figure": f"RSS, {CONCURRENCY} busy + {figures['rss']['queued']} queued",
                     "measured": f"{mib:.1f} MiB", "against": f"budget {TARGET_RSS_MIB:.0f} MiB",
                     "ratio": mib / TARGET_RSS_MIB, "target": "<= 1.0",
                     "met": mib <= TARGET_RSS_MIB})
    if ok("rest"):
        rest = figures["rest"]
        for half, floor_key, label, floor_label in (
                ("spawned", "spawn_floor", "delivery → spawned", "bare spawn"),
                ("reported", "post_floor", "exit → completion in", "bare POST")):
            for name, fraction in (("p50", 0.50), ("p99", 0.99)):
                took = percentile(rest[half], fraction) * 1e3
                floor = percentile(rest[floor_key], fraction) * 1e3
                rows.append({"figure": f"at rest, {label} {name}", "measured": f"{took:.2f} ms",
                             "against": f"{floor_label} {name} {floor:.2f} ms",
                             "ratio": took / floor, "target": f"<= {TARGET_REST_RATIO}",
                             "met": took / floor <= TARGET_REST_RATIO})
        for half, floor_key, label, floor_label in (
                ("spawned", "spawn_protocol_floor", "delivery → spawned", "floor-protocol"),
                ("reported", "post_protocol_floor", "exit → completion in", "floor-protocol")):
            # No target: how much of each half the protocol alone accounts for.
            if not rest.get(floor_key):
                continue
            for name, fraction in (("p50", 0.50), ("p99", 0.99)):
                took = percentile(rest[half], fraction) * 1e3
                floor = percentile(rest[floor_key], fraction) * 1e3
                rows.append({"figure": f"at rest, {label} {name} vs floor-protocol",
                             "measured": f"{took:.2f} ms",
                             "against": f"{floor_label} {name} {floor:.2f} ms",
                             "ratio": took / floor, "target": "-", "met": None})
            for name, fraction in (("p50", 0.50), ("p99", 0.99)):
                floor = percentile(rest[floor_key], fraction) * 1e3
                bare = percentile(rest[{"spawned": "spawn_floor",
                                        "reported": "post_floor"}[half]], fraction) * 1e3
                rows.append({"figure": f"at rest, floor-protocol {label} {name}",
                             "measured": f"{floor:.2f} ms",
                             "against": f"bare {name} {bare:.2f} ms", "ratio": floor / bare,
                             "target": f"(<= {TARGET_REST_RATIO} leaves the harness "
                             f"{max(0.0, TARGET_REST_RATIO * bare - floor):.2f} ms)",
                             "met": None})
    return rows


def print_report(figures: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    m = figures["machine"]
    print(f"Machine: {m['cpus']} × {m['cpu_model']}; Python {m['python']} on {m['platform']}; "
          f"temp dir {m['tmp_dir']} ({m['tmp_fs']}); load average before "
          + "/".join(f"{x:.2f}" for x in m["load_avg"])
          + (" after " + "/".join(f"{x:.2f}" for x in figures["load_after"])
             if "load_after" in figures else ""))
    s = figures["settings"]
    print(f"Settings: {s['runs']} runs, {s['probes']} probes, {s['queued']} queued, "
          f"{s['floor_samples']} floor samples, {s['rest_samples']} runs at rest, "
          f"concurrency {CONCURRENCY}")
    for key in ("spawn_floor", "post_floor", "floor_pipe", "floor_ledger", "floor_protocol",
                "e2e", "e2e_least", "echo",
                "insert", "rss", "rest"):
        value = figures.get(key)
        if isinstance(value, dict) and "error" in value:
            print(f"NOT MEASURED {key}: {value['error']}")
    e2e = figures["e2e"]
    if "error" not in e2e:
        print(f"End to end: {e2e['runs']} runs in {e2e['backlog_seconds']:.2f} s from the "
              f"harness's spawn ({e2e['backlog_seconds_from_connect']:.2f} s from its "
              f"connection), {e2e['probes']} probes alongside, all done at "
              f"{e2e['seconds']:.2f} s; server states {e2e['states']}; connections "
              f"{e2e['connections']}; harness start-up CPU {e2e['cpu_ms_startup']:.0f} ms "
              f"(left out); ack figures from the {e2e['acked_while_busy']} probes acked while "
              "the backlog ran" + ("" if e2e["acked_while_busy"] else " (none: all probes)"))
    for key, who in (("e2e", "harness"), ("e2e_least", "least harness")):
        run = figures.get(key, {"error": "absent"})
        if "error" in run or "cpu_ms_per_run_of" not in run:
            continue
        of = run["cpu_ms_per_run_of"]
        other = of["machine"] - of["harness"] - of["agents"] - of["server"] - of["bench"]
        print(f"Machine CPU per run, end to end with the {who} ({run['runs_per_s']:.0f} "
              f"runs/s): {of['machine']:.2f} ms = {who} {of['harness']:.2f} + its agents "
              f"{of['agents']:.2f} + server {of['server']:.2f} + this process (relay, "
              f"submitter) {of['bench']:.2f} + the rest (kernel, other processes) {other:.2f} ms")
    rss = figures["rss"]
    if "error" not in rss:
        print(f"RSS: {rss['rss_kib'] / 1024:.1f} MiB with {rss['active']} busy + "
              f"{rss['queued']} queued (peak {rss['peak_kib'] / 1024:.1f} MiB, "
              f"{rss['idle_rss_kib'] / 1024:.1f} MiB idle after connecting)")
    pipe = figures.get("floor_pipe", {"error": "absent"})
    if "error" not in pipe:
        print(f"Floor-pipe: {pipe['runs']} runs in {pipe['seconds']:.2f} s, "
              f"{pipe['runs_per_s']:.0f}/s, client CPU {pipe['cpu_ms_per_run']:.2f} ms per run"
              + (f", machine CPU {pipe['machine_cpu_ms_per_run']:.2f} ms per run"
                 if "machine_cpu_ms_per_run" in pipe else ""))
    book = figures.get("floor_ledger", {"error": "absent"})
    if "error" not in book:
        print(f"Floor-ledger: {book['runs']} runs in {book['seconds']:.2f} s, "
              f"{book['runs_per_s']:.0f}/s, client CPU {book['cpu_ms_per_run']:.2f} ms per run")
    least = figures.get("floor_protocol", {"error": "absent"})
    if "error" not in least:
        print(f"Floor-protocol: {least['runs']} runs in {least['seconds']:.2f} s, "
              f"{least['runs_per_s']:.0f}/s, client CPU {least['cpu_ms_per_run']:.2f} ms per run")
    rest = figures.get("rest", {"error": "absent"})
    if "error" not in rest:
        print(f"At rest: {rest['samples']} runs one at a time at --concurrency 1 (and one "
              f"uncounted), completions of {rest['completion_bytes']:.0f} B; each floor "
              "sampled once after each run")
    print(f"{'figure':<36} {'measured':>11}  {'against':<44} {'ratio':>6}  target")
    for row in rows:
        met = {True: "met", False: "MISSED", None: ""}[row["met"]]
        print(f"{row['figure']:<36} {row['measured']:>11}  {row['against']:<44} "
              f"{row['ratio']:5.2f}×  {row['target']} {met}")


def summarised(value: Any) -> Any:
    """``value`` with every list of latencies (seconds) replaced by its summary in ms."""
    if isinstance(value, dict):
        return {key: summarised(item) for key, item in value.items()}
    if isinstance(value, list) and len(value) > 8 and all(isinstance(v, float) for v in value):
        return {"n": len(value), "p50_ms": percentile(value, 0.5) * 1e3,
                "p99_ms": percentile(value, 0.99) * 1e3, "mean_ms": statistics.fmean(value) * 1e3}
    if isinstance(value, tuple):
        return list(value)
    return value


async def until_sigterm(measure: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    """``measure()``, cancelled (its processes stopped) on SIGTERM as on Ctrl-C."""
    result: dict[str, Any] = {}
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def work() -> None:
                result.update(await measure())
                nursery.cancel_scope.cancel()

            nursery.start_soon(work)
            async for _ in signals:
                raise KeyboardInterrupt("SIGTERM")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000,
                        help="runs submitted before the harness starts (default 2000)")
    parser.add_argument("--probes", type=int, default=300,
                        help="deliveries timed for ack latency (default 300)")
    parser.add_argument("--queued", type=int, default=10_000,
                        help="runs queued behind 16 busy for the RSS figure (default 10000)")
    parser.add_argument("--floor-samples", type=int, default=2000,
                        help="spawns and POSTs per floor (default 2000)")
    parser.add_argument("--rest-samples", type=int, default=200,
                        help="runs timed one at a time for the latency at rest (default 200)")
    parser.add_argument("--phase-s", type=float, default=120.0,
                        help="deadline of each floor phase in seconds; the two "
                        "server phases get 4× (default 120)")
    parser.add_argument("--quick", action="store_true",
                        help="small numbers for a smoke check (under a minute)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary directory (the processes' logs and homes)")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.probes, args.queued, args.floor_samples = 100, 30, 300, 100
        args.rest_samples = 20
        args.phase_s = 10.0
    figures = trio.run(until_sigterm, partial(main_async, args))
    rows = ratios(figures)
    if args.json:
        figures["ratios"] = rows
        print(json.dumps(summarised(figures), indent=2))
    else:
        print_report(figures, rows)
    return 0 if all("error" not in v for v in figures.values() if isinstance(v, dict)) else 1


if __name__ == "__main__":
    sys.exit(main())
