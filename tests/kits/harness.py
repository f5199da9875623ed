"""Shared pieces for tests that run a real harness against the real reference server.

Everything is real: the server is hypercorn on 127.0.0.1 port 0, the harness is the
production :class:`Harness` in this trio run, agents are subprocesses, the ledger is
a sqlite file in ``tmp_path``. The only stand-in is the agent, and the one here
(:class:`Gate`) is driven by the test over a socket, so a test can hold runs open,
see the order they start in, and let them finish one by one, without sleeping.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from prohost.engine.blocking import Bounds
from prohost.engine.harness import Harness
from prohost.engine.ledger import Ledger
from prohost.engine.link.connection import Endpoints
from prohost.home import Credentials, resolve_endpoints, save_credentials
from prohost.options import Options
from prohost.server import ServerConfig, ServerHandle, ServerState, serve
from prohost.wire.protocol import Ack, Message
from prohost.wire.signature import sign
from tests.kits.paths import AGENTS, logs_folder


@asynccontextmanager
async def wall_clock_bound(seconds: float) -> AsyncIterator[None]:
    """Fail the block with ``TooSlowError`` once ``seconds`` real seconds have passed.

    For tests on trio's still mock clock, where ``fail_after`` never fires and an
    awaited state that a regression keeps from coming would hang the test (and CI)
    instead of failing it. Not a timer of anything under test: a bound far above
    what the block takes. The real seconds are counted by one worker thread waiting
    on a ``threading.Event``, set when the block ends, so nothing is left behind.
    """
    block_done = threading.Event()
    expired = False
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            nonlocal expired
            if not await trio.to_thread.run_sync(block_done.wait, seconds):
                expired = True
                nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        try:
            yield
        finally:
            block_done.set()
    if expired:
        raise trio.TooSlowError(f"the block was still waiting after {seconds:.0f} real seconds")


async def wait_rescued_late(nursery: trio.Nursery, clock: trio.testing.MockClock,
                            done: trio.Event, release: Callable[[], object]) -> None:
    """Wait for ``done`` while a call hangs: from now on every wait takes its whole
    bound (trio's still clock jumps whenever every task waits), and the hung call is
    let go 60 s on, later than any bound, so that nothing is left hanging. Then
    ``nursery`` (which runs what set ``done``) is cancelled."""
    clock.autojump_threshold = 0

    async def rescue() -> None:
        await trio.sleep(60)
        release()

    nursery.start_soon(rescue)
    await done.wait()
    nursery.cancel_scope.cancel()


def agent_command(script: str, *args: object) -> str:
    """A shell command line that runs one of the fake agents in tests/agents."""
    parts = [sys.executable, str(AGENTS / script), *map(str, args)]
    return " ".join(shlex.quote(part) for part in parts)


@asynccontextmanager
async def running_server(**config: Any) -> AsyncIterator[ServerHandle]:
    async with trio.open_nursery() as nursery:
        handle: ServerHandle = await nursery.start(serve, ServerConfig(**config))
        try:
            yield handle
        finally:
            nursery.cancel_scope.cancel()


def api_headers(server: ServerHandle) -> dict[str, str]:
    """The header the server's people's API (submit, cancel, fault hooks) requires."""
    return {"Authorization": f"Bearer {server.api_token}"}


def pair_home(server: ServerHandle, home: Path, machine: str = "test") -> Credentials:
    data = server.pair(machine)
    creds = Credentials(
        token=data["token"], secret=data["secret"], ws_url=data["ws_url"],
        api_url=data.get("api_url"), account=data.get("account"),
    )
    save_credentials(home, creds)
    return creds


def endpoints_for(creds: Credentials) -> Endpoints:
    ws_url, api_base = resolve_endpoints(None, creds)
    return Endpoints(ws_url=ws_url, api_base=api_base, token=creds.token, secret=creds.secret)


@attrs.define
class Running:
    harness: Harness
    server: ServerHandle
    creds: Credentials
    ledger: Ledger | None
    scope: trio.CancelScope
    exit_code: list[int]
    exited: trio.Event

    async def wait_exit(self) -> int:
        """The harness's own exit status, once it returns by itself."""
        await self.exited.wait()
        return self.exit_code[0]


@asynccontextmanager
async def running_harness(
    server: ServerHandle,
    home: Path,
    *,
    connected: bool = True,
    env: dict[str, str] | None = None,
    clock: Callable[[], float] = time.time,
    **option_fields: Any,
) -> AsyncIterator[Running]:
    """The production harness in this trio run; waits for it to connect by default.

    Its agents run confined, as by default (docs/protocol.md §13); a fake that records
    what it saw writes into :func:`logs_folder` of the home's parent, which the
    kit opens with ``--allow-write`` unless the test says what to allow itself.
    """
    creds = pair_home(server, home)
    option_fields.setdefault("allow_write", (logs_folder(home.parent),))
    options = Options(home=home, machine="test", **option_fields)
    ledger = None if options.dry_run else Ledger.open(home / "ledger.sqlite3")
    exit_code: list[int] = []
    exited = trio.Event()
    try:
        async with httpx.AsyncHTTPTransport() as client, trio.open_nursery() as nursery:
            harness = Harness(options, endpoints_for(creds), client=client, ledger=ledger,
                              env=env, clock=clock)

            async def run_it(*, task_status: trio.TaskStatus[None]) -> None:
                exit_code.append(await harness.run(task_status=task_status))
                exited.set()

            await nursery.start(run_it)
            if connected:
                await server.wait_until(lambda s: s.connected > 0)
            yield Running(harness, server, creds, ledger, nursery.cancel_scope, exit_code, exited)
            nursery.cancel_scope.cancel()
    finally:
        if ledger is not None:
            ledger.close()


def messages(state: ServerState, kind: type[Message]) -> list[Any]:
    return [entry.message for entry in state.received if isinstance(entry.message, kind)]


def acks(state: ServerState) -> list[Ack]:
    return messages(state, Ack)


async def wait_for_ack(server: ServerHandle, delivery_id: str) -> Ack:
    def found(state: ServerState) -> bool:
        return any(ack.id == delivery_id for ack in acks(state))

    await server.wait_until(found)
    return next(ack for ack in acks(server.state) if ack.id == delivery_id)


def delivery_frame(
    secret: str,
    body: dict[str, Any] | str | Any,
    *,
    delivery_id: str = "dlv_test",
    event: str = "agent.run",
    timestamp: int | None = None,
    signature: str | bool | None = True,
) -> str:
    """A hand-made delivery, signed properly unless told otherwise."""
    text = body if isinstance(body, str) else json.dumps(body)
    ts = int(time.time()) if timestamp is None else timestamp
    frame: dict[str, Any] = {"type": "delivery", "id": delivery_id, "event": event,
                             "timestamp": ts, "body": text if isinstance(body, str | dict)
                             else body}
    if signature is True:
        frame["signature"] = sign(secret, ts, text)
    elif isinstance(signature, str):
        frame["signature"] = signature
    return json.dumps(frame)


async def ack_to(
    running: Running, body: dict[str, Any] | str, delivery_id: str = "d1", **frame_options: Any
) -> Ack:
    """Send ``body`` to the harness as a delivery, signed properly unless
    ``frame_options`` (those of :func:`delivery_frame`) say otherwise, and return the
    harness's ack to it."""
    await running.server.send_raw(delivery_frame(
        running.creds.secret, body, delivery_id=delivery_id, **frame_options))
    return await wait_for_ack(running.server, delivery_id)


def run_body(run_id: str, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "run_id": run_id,
        "conversation_id": None,
        "completion_path": f"/v1/agent/runs/{run_id}/complete",
        "text": "hello",
    }
    body.update(fields)
    return body


#: A pid no process can have (above the kernel's largest ``pid_max``).
NO_PID = 4_194_305


def host_pid(pid: int, run_id: str) -> int:
    """The pid, as this test sees it, of run ``run_id``'s process that calls itself
    ``pid``: the same unless it runs in a PID namespace of its own (a run confined
    by bubblewrap), whose numbers are the last of ``NSpid`` in ``/proc/<pid>/status``.
    :data:`NO_PID` when there is no such process (any more). Linux; elsewhere
    ``pid`` itself."""
    needle = f"PROHOST_RUN_ID={run_id}".encode()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return pid
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        nspids = [line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")]
        if nspids and nspids[0] and nspids[0][-1] == str(pid) and needle in environ.split(b"\0"):
            return int(entry)
    return NO_PID


class Gate:
    """The test's end of tests/agents/gated.py: see who started, let them finish."""

    def __init__(self) -> None:
        self.port = 0
        self.started: list[str] = []
        self.pids: dict[str, int] = {}
        self.running = 0
        self.max_running = 0
        self._streams: dict[str, trio.SocketStream] = {}
        self._changed = trio.Event()

    @property
    def command(self) -> str:
        return agent_command("gated.py", self.port)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            task_status.started()
            await trio.serve_listeners(self._handle, listeners, handler_nursery=nursery)

    async def _handle(self, stream: trio.SocketStream) -> None:
        buffer = b""
        while b"\n" not in buffer:
            chunk = await stream.receive_some()
            if not chunk:
                return
            buffer += chunk
        _, run_id, pid = buffer.split(b"\n", 1)[0].decode().split()
        self.started.append(run_id)
        self.pids[run_id] = host_pid(int(pid), run_id)
        self._streams[run_id] = stream
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        self._poke()
        try:
            while await stream.receive_some():
                pass
        except trio.BrokenResourceError:
            pass
        finally:
            self.running -= 1
            self._streams.pop(run_id, None)
            self._poke()

    def _poke(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait(self, predicate: Callable[[Gate], bool]) -> None:
        while not predicate(self):
            await self._changed.wait()

    async def wait_started(self, *run_ids: str) -> None:
        await self.wait(lambda gate: all(run_id in gate.started for run_id in run_ids))

    async def release(self, run_id: str, reply: str = "done") -> None:
        await self._streams[run_id].send_all(f"reply {reply}\n".encode())

    async def fail(self, run_id: str, code: int) -> None:
        await self._streams[run_id].send_all(f"exit {code}\n".encode())


async def start_run(server: ServerHandle, gate: Gate, text: str, **fields: Any) -> str:
    """Submit a run, and return its id once the Gate's agent has started it."""
    run_id = await server.submit_run(text, **fields)
    await gate.wait_started(run_id)
    return run_id


async def busy_and_queued(
    server: ServerHandle, gate: Gate, *lanes: str
) -> tuple[str, list[str]]:
    """A run on lane ``A`` that the harness's one slot starts (the Gate holds it), then
    one run on each of ``lanes``, accepted but waiting behind it (on lane ``A`` too, if
    named). Returns (the busy run, the waiting runs)."""
    busy = await start_run(server, gate, "long job", conversation_id="A")
    waiting = [await server.submit_run(f"waiting on {lane}", conversation_id=lane)
               for lane in lanes]
    await server.wait_until(lambda s: all(s.runs[r].state == "accepted" for r in waiting))
    return busy, waiting


def run_state(server: ServerHandle, run_id: str) -> str:
    return server.state.runs[run_id].state


def finished(*run_ids: str) -> Callable[[ServerState], bool]:
    return lambda state: all(
        state.runs[run_id].state in ("completed", "failed") for run_id in run_ids
    )


@asynccontextmanager
async def gated_harness(
    tmp_path: Path, **option_fields: Any
) -> AsyncIterator[tuple[Gate, Running]]:
    """A reference server and a harness whose agents are the test's :class:`Gate`."""
    gate = Gate()
    async with trio.open_nursery() as nursery:
        await nursery.start(gate.serve)
        async with running_server() as server, running_harness(
            server, tmp_path, exec_command=gate.command, **option_fields
        ) as running:
            yield gate, running
        nursery.cancel_scope.cancel()


def around_steps(monkeypatch: Any,
                 around: Callable[[str, Callable[[], Awaitable[Any]]], Awaitable[Any]]) -> None:
    """From now on, every bounded ledger step — a worker-thread hop (``Bounds.run``)
    or the wait for a job of the ledger's writer thread (``Bounds.wait``) — is made
    as ``around(what, step)``, which must await ``step()`` (the real one) and return
    what it returns, or let what it raises through."""
    run, wait = Bounds.run, Bounds.wait

    async def run_around(self: Bounds, fn: Callable[..., Any], *args: object,
                         limit_s: float, what: str) -> Any:
        return await around(what, lambda: run(self, fn, *args, limit_s=limit_s, what=what))

    async def wait_around(self: Bounds, done: trio.Event, *, limit_s: float,
                          what: str) -> None:
        await around(what, lambda: wait(self, done, limit_s=limit_s, what=what))

    monkeypatch.setattr(Bounds, "run", run_around)
    monkeypatch.setattr(Bounds, "wait", wait_around)


def counted_steps(monkeypatch: Any) -> list[str]:
    """From now on, the ``what`` of every bounded ledger step (a worker-thread hop, or
    a job handed to the ledger's writer thread: :func:`around_steps`), in order."""
    steps: list[str] = []

    async def counted(what: str, step: Callable[[], Awaitable[Any]]) -> Any:
        steps.append(what)
        return await step()

    around_steps(monkeypatch, counted)
    return steps


async def released(harness: Harness, run_id: str) -> None:
    """Return once ``harness`` no longer holds ``run_id`` (reported, dropped, or never
    held), as its public state says. Cancelling it only stops the wait."""
    await harness.wait_until(lambda seen: run_id not in seen.held)
