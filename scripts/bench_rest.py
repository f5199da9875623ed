"""Pieces of ``scripts/bench_e2e.py``'s floor-pipe and latency-at-rest figures.

Kept apart so that the main script stays readable; nothing here starts a
``prohost`` process (the phases themselves are in ``bench_e2e.py``).

- :data:`FLOOR_PIPE_CLIENT`: the client process of floor-pipe (the least any
  harness must do per run), which prints its figures as one JSON line.
- :class:`Marks`: a fifo the latency agent (and the bare-spawn floor) writes one
  byte to as its first action (``s``) and one just before it exits (``e``); each
  byte is stamped with ``time.monotonic()`` when this process reads it.
- :class:`Inbox`: the harness's API base during the latency phase. An ASGI app
  served by hypercorn's trio worker in this process: it stamps each request's
  arrival (``time.monotonic()`` once its whole body is in), then passes it on to the
  real server and hands back the server's answer; ``POST /floor`` (the bare-POST
  floor) is stamped the same way and answered at once, as the minimal app does.

``time.monotonic()`` is CLOCK_MONOTONIC, one clock for every process on Linux, but
every stamp here is taken in this process anyway (the harness's moments are seen as
they reach it), so the harness's figures and their floors pass through the same
reads and wake-ups.
"""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path
from typing import Any

import httpx
import hypercorn.trio
import trio
from hypercorn.config import Config

from prohost.server.asgi import answer_lifespan

#: The HTTP floor's server (floors b and c): a minimal ASGI app under hypercorn's trio
#: worker, in a process of its own, that reads the body and answers a small JSON, the
#: way the completion endpoint does. Prints its base URL.
MINIMAL_APP = r"""
import sys, trio, hypercorn.trio
from hypercorn.config import Config
from prohost.server.asgi import answer_lifespan

async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        return await answer_lifespan(receive, send)
    if scope["type"] == "websocket":
        # Only floor-protocol's app (bench_protocol_floor.PROTOCOL_APP) is dialled, and
        # it defines ``deliveries`` ahead of this code.
        return await deliveries(receive, send)
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    body = b'{"ok":true}'
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})

async def main():
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(hypercorn.trio.serve, app, config)
        print(binds[0], flush=True)

trio.run(main)
"""

#: The floor clients' common part: their CPU clock and the durable steps' writer.
FLOOR_LEDGER = r"""
import json, os, queue, resource, sqlite3, sys, threading, time, httpx, trio

def cpu():
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime

def machine():
    # Every CPU's time not idle (nor iowait), as bench_e2e.machine_busy_seconds.
    with open("/proc/stat") as stat:
        fields = [int(field) for field in stat.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")

class Ledger:
    def __init__(self, path):
        self.token = trio.lowlevel.current_trio_token()
        self.jobs = queue.SimpleQueue()
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.execute("CREATE TABLE runs (id TEXT PRIMARY KEY, body TEXT, "
                          "state TEXT, pgid INTEGER, outcome TEXT)")
        self.thread = threading.Thread(target=self.serve)
        self.thread.start()

    def serve(self):
        while True:
            batch = [self.jobs.get()]
            while True:
                try:
                    batch.append(self.jobs.get_nowait())
                except queue.Empty:
                    break
            work = [job for job in batch if job is not None]
            if work:
                self.conn.execute("BEGIN IMMEDIATE")
                for sql, args, _ in work:
                    self.conn.execute(sql, args)
                self.conn.execute("COMMIT")
                wakes = [wake for _, _, wake in work if wake is not None]
                if wakes:
                    self.token.run_sync_soon(lambda wakes=wakes: [wake() for wake in wakes])
            if len(work) < len(batch):
                return

    async def step(self, sql, *args):
        done = trio.Event()
        self.jobs.put((sql, args, done.set))
        await done.wait()

    def soon(self, sql, *args):
        # Committed with the next batch, not waited for (the harness's ``reported``).
        self.jobs.put((sql, args, None))

    def close(self):
        self.jobs.put(None)
        self.thread.join()
"""

#: floor-pipe's client: ``argv`` is the app's URL, runs, width, stdin bytes, and a
#: ledger file or ``-``. Runs ``sh -c cat`` with the bytes on stdin and POSTs its
#: output, ``width`` at a time; prints runs/s over the batch and the process's own
#: CPU (getrusage RUSAGE_SELF: every thread, not the children) per run. One run goes
#: first, not counted: the imports and the first connection are start-up, as the
#: harness's are left out.
#:
#: With a ledger file (floor-ledger), each run also makes the four durable steps
#: docs/protocol.md §7 asks of any harness — ``accepted`` with the body, ``started``, the
#: process group, ``finished`` with the outcome — each a commit with its fsync (WAL,
#: ``synchronous=FULL``) before the next, group-committed by one writer thread fed by
#: a ``queue.SimpleQueue`` that wakes trio once per batch, as the harness's ledger
#: is: the least the ledger's durability costs, with nothing of prohost in it.
FLOOR_PIPE_CLIENT = FLOOR_LEDGER + r"""
url, count, width, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ledger_path = sys.argv[5] if len(sys.argv) > 5 and sys.argv[5] != "-" else None

async def main():
    payload = b"x" * size
    left = count
    ledger = Ledger(ledger_path) if ledger_path else None
    async with httpx.AsyncClient() as client:
        async def one(n):
            if ledger:
                await ledger.step("INSERT INTO runs (id, body, state) VALUES (?, ?, ?)",
                                  str(n), payload.decode(), "accepted")
                await ledger.step("UPDATE runs SET state = 'started' WHERE id = ?", str(n))
            result = await trio.run_process(["sh", "-c", "cat"], stdin=payload,
                                            capture_stdout=True)
            if result.stdout != payload:
                raise RuntimeError("sh -c cat did not echo its stdin")
            if ledger:
                await ledger.step("UPDATE runs SET pgid = ? WHERE id = ?", 1, str(n))
                await ledger.step("UPDATE runs SET state = 'finished', outcome = ? "
                                  "WHERE id = ?", result.stdout.decode(), str(n))
            (await client.post(url, content=result.stdout)).raise_for_status()

        async def worker():
            nonlocal left
            while left > 0:
                left -= 1
                await one(left)

        await one(-1)
        cpu_began, machine_began, began = cpu(), machine(), time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(width):
                nursery.start_soon(worker)
        seconds, used = time.perf_counter() - began, cpu() - cpu_began
        machine_used = machine() - machine_began
    if ledger:
        ledger.close()
    print(json.dumps({"runs": count, "seconds": seconds, "runs_per_s": count / seconds,
                      "cpu_ms_per_run": used * 1e3 / count,
                      "machine_cpu_ms_per_run": machine_used * 1e3 / count}), flush=True)

trio.run(main)
"""


def agent_command(fifo: Path) -> str:
    """The latency agent (an ``--exec`` line, run by ``/bin/sh -c``): ``s`` to the
    fifo first, its stdin echoed as the reply, ``e`` to the fifo just before it exits.
    Only shell built-ins around ``cat``, so that the first mark is the shell's first
    action and the last is right before its exit."""
    path = shlex.quote(str(fifo))
    return f"printf s >{path}; cat; printf e >{path}"


class Marks:
    """The fifo of :func:`agent_command`, read by :meth:`read`; ``events`` holds
    (byte, time.monotonic() when read) in order."""

    def __init__(self, path: Path) -> None:
        os.mkfifo(path)
        self.path = path
        self.events: list[tuple[str, float]] = []
        self._changed = trio.Event()

    async def read(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read marks until cancelled. Cancelled: the fifo is closed."""
        # O_RDWR: this end also counts as a writer, so the fifo never reads as ended
        # between two agents, and an agent's open for writing never blocks.
        fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK)
        async with trio.lowlevel.FdStream(fd) as stream:
            task_status.started()
            while True:
                data = await stream.receive_some()
                now = time.monotonic()
                self.events.extend((mark, now) for mark in data.decode())
                self._changed.set()
                self._changed = trio.Event()

    async def first(self, mark: str, after: int) -> float:
        """When the first ``mark`` at or after ``events[after]`` was read (waits for it)."""
        while True:
            for seen, at in self.events[after:]:
                if seen == mark:
                    return at
            await self._changed.wait()


class Inbox:
    """The harness's API base in the latency phase; see the module docstring.
    ``arrived`` maps a request's ``Idempotency-Key`` (a completion's run id) to the
    moment its body was in; ``answered`` a completion's run id to the server's status."""

    def __init__(self, upstream: str, client: httpx.AsyncClient) -> None:
        self.upstream = upstream.rstrip("/")
        self.client = client
        self.url = ""
        self.arrived: dict[str, float] = {}
        self.sizes: dict[str, int] = {}
        self.answered: dict[str, int] = {}
        self._changed = trio.Event()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on 127.0.0.1 until cancelled. Cancelled: hypercorn stops serving."""
        config = Config()
        config.bind = ["127.0.0.1:0"]
        config.accesslog = None
        config.errorlog = None
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(hypercorn.trio.serve, self, config)
            self.url = binds[0]
            task_status.started()

    async def wait_arrived(self, key: str) -> None:
        """Wait until a request keyed ``key`` has come in whole."""
        while key not in self.arrived:
            await self._changed.wait()

    async def wait_answered(self, key: str) -> None:
        """Wait until the server has answered the completion keyed ``key``."""
        while key not in self.answered:
            await self._changed.wait()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await answer_lifespan(receive, send)
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        now = time.monotonic()
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        key = next((v for k, v in headers if k.lower() == "idempotency-key"), "")
        completion = scope["path"].endswith("/complete")
        if completion or scope["path"] == "/floor":
            # A retried completion keeps its first arrival.
            self.arrived.setdefault(key, now)
            self.sizes.setdefault(key, len(body))
        if scope["path"] == "/floor":
            status, content, kind = 200, b'{"ok":true}', "application/json"
        else:
            query = scope.get("query_string", b"").decode("latin-1")
            answer = await self.client.request(
                scope["method"], self.upstream + scope["path"] + (f"?{query}" if query else ""),
                content=body, headers=[(k, v) for k, v in headers if k.lower() not in (
                    "host", "content-length", "connection", "transfer-encoding")])
            status, content = answer.status_code, answer.content
            kind = answer.headers.get("content-type", "application/json")
            if completion:
                self.answered[key] = status
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", kind.encode("latin-1")),
                                (b"content-length", str(len(content)).encode())]})
        await send({"type": "http.response.body", "body": content})
        self._changed.set()
        self._changed = trio.Event()
