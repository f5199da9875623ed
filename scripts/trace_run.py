#!/usr/bin/env python3
"""Trace one run's path through the harness's rooms, and count its back-and-forths.

Usage: .venv/bin/python scripts/trace_run.py [--json] [--all-tasks]

What runs: the reference server on 127.0.0.1 port 0 and the production ``Harness``
in this trio run, paired with it, as ``prohost agent run --brain claude --exec
<tests/agents/fake_claude.py> --repos <a temporary git repository>`` with the
default ``--sandbox auto`` (confined when the machine can). One run is submitted on
a conversation; the trace lasts from just before the server sends its delivery
frame to the moment the run is let go (its completion posted and settled, its lane
free again).

How it is traced: ``sys.setprofile`` on the trio thread sees every call. A call is
kept when its function's module is under ``prohost/``; a coroutine's resumption is
not a call (the profiler's ``call`` event on a ``RESUME`` whose argument is not 0 is
left out). Each kept call is put in its *room*, the parts docs/architecture.md
names: ``harness`` (the composition root, ``engine/harness.py``), an engine
subpackage (``supervisor``, ``run``, ``lanes``, ``link``, ``report``, ``agent``,
``ledger``, ``repos``, ``accounts``, ``sandbox``, ``view``), an engine top module
(``blocking``, ``changes``, ``lognames``, ``retention``, ``signals``), and outside the
engine the first part of the module's name (``wire``, ``server``, ``options``...).
Worker threads (the ledger's writer, ``trio.to_thread``) are not traced: a job
there starts a stack of its own, with no room below it, so no call in it can be a
back-and-forth as defined here.

**A back-and-forth** is a call into room R, from a function of room C (the room of
the nearest ``prohost`` frame below it on the call stack), where C is not R and R
is already on the stack below C: a room that called out is called back into
before the call out returned (the runner calling the harness's ``release_slot``
while running inside the harness's ``_work``). Each distinct ``(C -> R, the
function called)`` counts once per trace, however often it happens. The stack is
the real one (each frame's ``f_back``): for a coroutine that is the chain of
awaits of its trio task, so calls made in a task of their own (a nursery's
``start_soon``) have only that task's frames below them.

**The run's path** is what the tasks that carry the run do: by default only calls
whose trio task is one of those (the link's reader, which takes the frame and
admits the run, in the harness's ``_guard_link`` task; the scheduler's; the run's
own work task and the tasks it starts, such as its timeline's). Tasks that only
look at the harness meanwhile (status.json, the beacon's heartbeats, the outbox's
loop) are listed apart with ``--all-tasks``.

Printed: the count, each back-and-forth, and the path: the rooms in the order the
run's calls entered them (a room listed again each time the path comes back to
it from another), with ``*`` marking an entry that is a back-and-forth.
"""

from __future__ import annotations

import argparse
import dis
import json
import logging
import os
import shlex
import subprocess
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from prohost.engine.harness import Harness
from prohost.engine.ledger import Ledger
from prohost.engine.link.connection import Endpoints
from prohost.home import Credentials, resolve_endpoints, save_credentials
from prohost.options import Options
from prohost.server import ServerConfig, serve

ROOT = Path(__file__).resolve().parents[1]
FAKE_CLAUDE = ROOT / "tests" / "agents" / "fake_claude.py"
#: The engine's subpackages, each a room (docs/architecture.md, "Rooms").
ENGINE_ROOMS = ("supervisor", "view", "run", "lanes", "link", "report", "agent", "ledger",
                "repos", "accounts", "sandbox")
#: Trio task names that carry the run (see the module docstring); matched by prefix.
RUN_TASKS = ("prohost.engine.harness.Harness._guard_link", "scheduler ",
             "prohost.engine.harness.Harness._work", "prohost.engine.run.",
             "prohost.engine.report.timeline", "prohost.engine.harness.Harness._then_release")
_RESUME = dis.opmap["RESUME"]


def room_of(module: str) -> str | None:
    """The room of a ``prohost`` module by its name; ``None`` outside ``prohost``."""
    parts = module.split(".")
    if parts[0] != "prohost":
        return None
    if len(parts) == 1:
        return "base"
    if parts[1] == "engine":
        if len(parts) == 2:
            return "engine"
        if parts[2] == "harness":
            return "harness"
        return parts[2]
    return parts[1]


@attrs.define
class BackAndForth:
    caller: str
    room: str
    function: str
    task: str
    times: int = 1

    def key(self) -> tuple[str, str, str]:
        return (self.caller, self.room, self.function)

    def line(self) -> str:
        return f"{self.caller} -> {self.room}: {self.function} (x{self.times}, task {self.task})"


@attrs.define
class Trace:
    """What one run's trace found (see the module docstring)."""

    run_id: str = ""
    #: The run's path: (room, is a back-and-forth), consecutive repeats folded.
    path: list[tuple[str, bool]] = attrs.Factory(list)
    back_and_forths: dict[tuple[str, str, str], BackAndForth] = attrs.Factory(dict)
    #: Back-and-forths of the tasks that only look at the harness (not the run's).
    elsewhere: dict[tuple[str, str, str], BackAndForth] = attrs.Factory(dict)
    calls: int = 0
    completion: dict[str, Any] | None = None

    @property
    def count(self) -> int:
        return len(self.back_and_forths)

    def report(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "back_and_forths": self.count,
            "list": [entry.line() for entry in self.back_and_forths.values()],
            "path": " > ".join(room + ("*" if back else "") for room, back in self.path),
            "elsewhere": [entry.line() for entry in self.elsewhere.values()],
            "calls": self.calls, "completion_ok": (self.completion or {}).get("ok"),
            "completion_error": (self.completion or {}).get("error"),
        }


class Profiler:
    """The ``sys.setprofile`` hook: rooms and back-and-forths of each ``prohost`` call."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self._rooms: dict[str, str | None] = {}

    def _room(self, frame: types.FrameType) -> str | None:
        module = frame.f_globals.get("__name__", "")
        try:
            return self._rooms[module]
        except KeyError:
            room = self._rooms[module] = room_of(module)
            return room

    def __call__(self, frame: types.FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        room = self._room(frame)
        if room is None:
            return
        code = frame.f_code
        if code.co_name == "<module>":
            return  # an import, not a step of the run
        raw = code.co_code
        at = frame.f_lasti
        if 0 <= at < len(raw) - 1 and raw[at] == _RESUME and raw[at + 1] != 0:
            return  # a coroutine or generator resumed, not called
        caller: str | None = None
        below: set[str] = set()
        back = frame.f_back
        while back is not None:
            found = self._room(back)
            if found is not None:
                if caller is None:
                    caller = found
                else:
                    below.add(found)
            back = back.f_back
        task = _task_name()
        ours = task.startswith(RUN_TASKS)
        is_back = caller is not None and caller != room and room in below
        if ours:
            self.trace.calls += 1
            path = self.trace.path
            if is_back or not path or path[-1][0] != room:
                path.append((room, is_back))
        if not is_back:
            return
        assert caller is not None
        table = self.trace.back_and_forths if ours else self.trace.elsewhere
        key = (caller, room, code.co_qualname)
        entry = table.get(key)
        if entry is None:
            table[key] = BackAndForth(caller, room, code.co_qualname, task)
        else:
            entry.times += 1


def _task_name() -> str:
    try:
        return trio.lowlevel.current_task().name
    except RuntimeError:
        return "(no task)"


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(cwd), "-c", "user.name=Trace", "-c",
                    "user.email=trace@example.invalid", *args],
                   check=True, capture_output=True, stdin=subprocess.DEVNULL)


def make_repo(path: Path) -> Path:
    """A git repository with one commit on ``main``, for ``--repos``."""
    path.mkdir(parents=True)
    _git(path, "init", "-q", "-b", "main")
    (path / "README").write_text("traced\n")
    _git(path, "add", "-A")
    _git(path, "commit", "-q", "-m", "first")
    return path


async def trace_one_run(work: Path) -> Trace:
    """Run a server and a harness in this trio run, trace one run, stop both.

    Cancelled: the server and the harness are cancelled with it (the harness kills
    its agents on the way out), and the profiler is removed."""
    repo = make_repo(work / "repo")
    home = work / "home"
    home.mkdir()
    logs = work / "logs"
    logs.mkdir()
    env = {**os.environ, "FAKE_CLAUDE_SCENARIO": "reply",
           "GIT_CONFIG_GLOBAL": str(work / "gitconfig"), "GIT_CONFIG_NOSYSTEM": "1"}
    (work / "gitconfig").write_text("[user]\n\tname = Trace\n\temail = t@example.invalid\n")
    trace = Trace()
    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve, ServerConfig(heartbeat_s=3600.0))
        data = server.pair("trace")
        creds = Credentials(token=data["token"], secret=data["secret"], ws_url=data["ws_url"],
                            api_url=data.get("api_url"), account=data.get("account"))
        save_credentials(home, creds)
        ws_url, api_base = resolve_endpoints(None, creds)
        endpoints = Endpoints(ws_url=ws_url, api_base=api_base, token=creds.token,
                              secret=creds.secret)
        exec_line = f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE_CLAUDE))}"
        options = Options(home=home, machine="trace", brain="claude", exec_command=exec_line,
                          repos=(repo,), sandbox="auto", allow_write=(logs,))
        ledger = Ledger.open(home / "ledger.sqlite3")
        try:
            async with httpx.AsyncHTTPTransport() as client:
                harness = Harness(options, endpoints, client=client, ledger=ledger, env=env)
                await nursery.start(harness.run)
                await server.wait_until(lambda state: state.connected > 0)
                profiler = Profiler(trace)
                sys.setprofile(profiler)
                try:
                    run_id = await server.submit_run("hello", conversation_id="traced")
                    trace.run_id = run_id
                    await server.wait_until(
                        lambda state: state.runs[run_id].completion is not None)
                    await harness.wait_until(lambda h: run_id not in h.held)
                    await harness.wait_until(
                        lambda h: not h.scheduler.statistics().reporting)
                finally:
                    sys.setprofile(None)
                trace.completion = server.run(run_id).completion
                nursery.cancel_scope.cancel()
        finally:
            ledger.close()
    return trace


def print_trace(trace: Trace, *, all_tasks: bool = False) -> None:
    report = trace.report()
    print(f"run {trace.run_id}: {trace.calls} calls in prohost on its path; "
          f"completion ok={report['completion_ok']} {report['completion_error'] or ''}")
    print(f"back-and-forths: {trace.count}")
    for line in report["list"]:
        print(f"  {line}")
    print(f"path: {report['path']}")
    if all_tasks:
        print(f"elsewhere (tasks that only look at the harness): {len(trace.elsewhere)}")
        for line in report["elsewhere"]:
            print(f"  {line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the trace as JSON")
    parser.add_argument("--all-tasks", action="store_true",
                        help="also list the back-and-forths of other tasks")
    args = parser.parse_args(argv)
    # The harness's own warnings (running as root, the home's mode) are not the trace's.
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="prohost-trace-") as folder:
        trace = trio.run(trace_one_run, Path(folder))
    if args.json:
        print(json.dumps(trace.report(), indent=2))
    else:
        print_trace(trace, all_tasks=args.all_tasks)
    return 0 if trace.completion is not None and trace.completion.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
