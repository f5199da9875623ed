"""The soak itself: a real ``prohost server --faults`` and a real ``prohost agent run``
on 127.0.0.1, the plan's runs submitted over HTTP, the plan's faults injected as
the runs go, and at the end the figures (:mod:`soaklib.verdict`).

Pacing: at most ``backlog`` runs are submitted and not yet settled at once, and
each fault fires once ``at_run`` runs have settled, while submissions go on; so
the faults are spread over the whole soak and each finds runs queued, running and
reporting.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any, TextIO

import httpx
import trio

from soaklib import verdict
from soaklib.faults import EXIT_WITHIN_S, FIRST_LINE_WITHIN_S, Faults
from soaklib.faulty_ledger import program as faulty_prohost
from soaklib.plan import fault_counts
from soaklib.pressure import Pressure
from soaklib.procs import Child, kill_marked, marked_processes, start_child

HERE = Path(__file__).resolve().parent
#: The soak polls the server's audit this often (seconds); it paces submissions.
POLL_S = 0.25
#: After the last run is submitted, a fault still waits this long (seconds) for its
#: ``at_run`` runs to settle, then fires anyway (lost runs never settle).
LATE_FAULT_WAIT_S = 20.0
#: More unexpected harness exits than this ends the soak: it is crash-looping.
MAX_CRASHES = 10
#: The opening burst holds every agent until a delivery is refused 503 "queue full",
#: at most this long (seconds; a backlog too small for the queue never gets one).
BURST_WITHIN_S = 60.0


class SoakAborted(Exception):
    """The soak could not go on (the server died, the harness crash-loops)."""


def _answered(run: dict[str, Any]) -> bool:
    """The server no longer offers ``run``: settled, or its last ack was final (a 200,
    or a 204 for a run the harness had already reported)."""
    return run["state"] in ("completed", "failed") or run["acked"] or (
        bool(run["ack_statuses"]) and run["ack_statuses"][-1] != 503)


def _base_env() -> dict[str, str]:
    """The soak's environment without any PROHOST_ setting of the person running it
    (their home, URL or log mode must not leak into the soak's processes)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PROHOST_")}


class Soak(Pressure, Faults):
    """One soak: its processes, the server's audit, the timeline, the figures."""

    def __init__(self, plan: dict[str, Any], out: Path, *, concurrency: int, backlog: int,
                 max_seconds: float, max_queued: int = 10_000, limit_wait_s: float = 2.0,
                 disk_mode: str = "hook") -> None:
        self.plan = plan
        self.out = out
        self.limit_wait_s = limit_wait_s
        self.disk_mode = disk_mode
        self.accounts_dir = out / "accounts"
        #: What the stand-in agents write (their starts and refusals): the one folder
        #: outside a run's own places that the harness opens to its confined agents
        #: (``--allow-write``, docs/protocol.md §13); confinement stays on, as by default.
        self.marks = out / "marks"
        self.marks.mkdir(parents=True, exist_ok=True)
        self.refusals_path = self.marks / "refusals.txt"
        self.hold_path = out / "hold"
        #: Whether the opening burst got its 503 "queue full" (None: not over yet).
        self.burst_refused: bool | None = None
        self.concurrency = concurrency
        self.backlog = backlog
        self.max_queued = max_queued
        self.max_seconds = max_seconds
        self.marker = f"soakmark-{secrets.token_hex(6)}"
        self.home = out / "home"
        self.starts_path = self.marks / "starts.txt"
        self.audit: dict[str, dict[str, Any]] = {}
        self._audit_changed = trio.Event()
        self.harness: Child | None = None
        self.harnesses: list[Child] = []
        self.server: Child | None = None
        self.crashes: list[str] = []
        self.ending = False
        self.timed_out = False
        self.interrupted = False
        self.submitted = 0
        self.injected: dict[str, int] = {}
        self.cancelled: dict[str, int] = {}
        self.t0 = 0.0
        self.http = ""
        self.ws_url = ""
        self._timeline: TextIO | None = None
        self._nursery: trio.Nursery | None = None
        self._client: httpx.AsyncClient | None = None
        self._drive_scope = trio.CancelScope()
        self.aborted: str | None = None
        self.left: list[str] = []
        self._settled_seen = 0
        self._last_settle = 0.0
        self.outcomes: Counter[str] = Counter()
        self.planned: dict[str, int] = {}

    # ------------------------------------------------------------------ records

    def note(self, event: str, **details: Any) -> None:
        """One line of the fault timeline (seconds since the start)."""
        if self._timeline is not None:
            entry = {"t": round(trio.current_time() - self.t0, 3), "event": event, **details}
            self._timeline.write(json.dumps(entry) + "\n")
            self._timeline.flush()

    def crash(self, what: str) -> None:
        self.crashes.append(what)
        self.note("crash", what=what)

    def abort(self, why: str) -> None:
        """Stop driving (the server died, the harness crash-loops); the figures
        are still computed from what happened."""
        if self.aborted is None:
            self.aborted = why
            self.note("abort", why=why)
        self._drive_scope.cancel()

    # ------------------------------------------------------------------ the server

    async def call(self, method: str, path: str, payload: Any = None) -> httpx.Response:
        """One request to the server, retried while its listener is restarting.
        Cancelled: the request is abandoned."""
        if self._client is None:
            raise RuntimeError("soak bug: no HTTP client yet")
        while True:
            try:
                return await self._client.request(method, self.http + path, json=payload,
                                                  timeout=30)
            except httpx.TransportError:
                if self.server is not None and self.server.exited.is_set():
                    self.abort("the reference server exited; see server.log")
                    await trio.sleep_forever()
                await trio.sleep(0.05)

    async def start_server(self) -> None:
        """Start the server on a free port of 127.0.0.1, read its banner, pair the
        harness's home. Cancelled: the server is left to the end-of-soak cleanup."""
        argv = [sys.executable, "-m", "prohost", "server", "--host", "127.0.0.1",
                "--port", "0", "--faults", "--no-state", "--retries", "0"]
        self.server = await start_child("server", argv, self.out / "server.log", _base_env())
        nursery = self._need_nursery()
        nursery.start_soon(self.server.pump)
        nursery.start_soon(self._watch_server, self.server)
        fields: dict[str, str] = {}
        for label in ("pairing code:", "API token:", "WebSocket:", "HTTP:"):
            with trio.move_on_after(FIRST_LINE_WITHIN_S):
                line = await self.server.wait_line(lambda text, label=label: label in text)
            if line is None:
                raise SoakAborted("the reference server did not start; see server.log")
            fields[label] = line.split(label, 1)[1].strip()
        self.http, self.ws_url = fields["HTTP:"], fields["WebSocket:"]
        if not self.http.startswith("http://127.0.0.1:"):
            raise SoakAborted(f"the server listens on {self.http}, not 127.0.0.1")
        self.note("server_start", pid=self.server.pid, http=self.http)
        # The fault hooks and submitting runs need the token the server wrote.
        token_file = Path(fields["API token:"].split()[0])
        token = (await trio.Path(token_file).read_text()).strip()
        self._client = httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"})
        await self._pair(fields["pairing code:"])

    async def _watch_server(self, server: Child) -> None:
        """Note the server's exit; one the soak did not ask for is a crash (and the
        next request aborts the soak). Cancelled: stops watching."""
        await server.proc.wait()
        server.exited.set()
        if not self.ending:
            self.crash(f"the reference server exited with {server.proc.returncode}")

    async def _pair(self, code: str) -> None:
        """``prohost agent pair`` into the soak's home. Cancelled: the pair process
        is killed (trio.run_process)."""
        env = _base_env() | {"PROHOST_HOME": str(self.home)}
        result = await trio.run_process(
            [sys.executable, "-m", "prohost", "agent", "pair", "--code", code,
             "--url", self.ws_url, "--machine", "soak"],
            env=env, capture_stdout=True, capture_stderr=True, check=False)
        if result.returncode != 0:
            raise SoakAborted(f"pairing failed: {result.stderr.decode(errors='replace')}")

    async def poll(self) -> None:
        """Keep ``audit`` fresh. Cancelled: stops polling."""
        while True:
            answer = await self.call("GET", "/v1/faults/runs")
            self.audit = {run["run_id"]: run for run in answer.json()["runs"]}
            if self.settled() != self._settled_seen:
                self._settled_seen = self.settled()
                self._last_settle = trio.current_time()
            self._audit_changed.set()
            self._audit_changed = trio.Event()
            await trio.sleep(POLL_S)

    async def until(self, predicate: Any) -> None:
        """Return once ``predicate()`` holds on the audit. Cancelled: returns nothing."""
        while not predicate():
            await self._audit_changed.wait()

    def settled(self) -> int:
        return sum(1 for run in self.audit.values() if run["state"] in ("completed", "failed"))

    def held(self) -> list[str]:
        """Runs a harness acked and the server has no completion for, in run order."""
        return sorted(run_id for run_id, run in self.audit.items()
                      if run["acked"] and run["completion"] is None)

    # ------------------------------------------------------------------ the harness

    def _need_nursery(self) -> trio.Nursery:
        if self._nursery is None:
            raise RuntimeError("soak bug: no nursery yet")
        return self._nursery

    async def start_harness(self) -> Child:
        """Start one more ``prohost agent run`` on the soak's home and watch it.
        Cancelled: a harness already started is left to the end-of-soak cleanup."""
        index = len(self.harnesses)
        agent = " ".join(shlex.quote(part) for part in (
            sys.executable, str(HERE / "agent.py"), "--starts", str(self.starts_path),
            "--sleeps", str(self.out / "sleeps.json"), "--refusals", str(self.refusals_path),
            "--hold", str(self.hold_path), "--marker", self.marker))
        # The hook's disk fills through the ledger's connection class (a seam the
        # soak sets in its harness process, soaklib/faulty_ledger.py).
        prohost = (faulty_prohost(full_while=str(self.disk_control()))
                   if self.disk_mode == "hook" else [sys.executable, "-m", "prohost"])
        argv = [*prohost, "agent", "run", "--url", self.ws_url,
                "--brain", "claude", "--exec", agent, "--concurrency", str(self.concurrency),
                "--max-queued", str(self.max_queued), "--machine", "soak", "--no-panel",
                "--limit-wait", f"{self.limit_wait_s:g}", "--allow-write", str(self.marks)]
        for name, folder in self.account_folders().items():
            argv += ["--account", f"{name}={folder}"]
        env = _base_env() | {"PROHOST_HOME": str(self.home)}
        harness = await start_child(f"harness {index}", argv,
                                    self.out / f"harness-{index:03d}.log", env)
        self.harnesses.append(harness)
        self.harness = harness
        nursery = self._need_nursery()
        nursery.start_soon(harness.pump)
        nursery.start_soon(self._watch_harness, harness)
        self.note("harness_start", index=index, pid=harness.pid)
        return harness

    async def _watch_harness(self, harness: Child) -> None:
        """Judge one harness's exit (status, tracebacks) and start another if the
        exit was not the soak's doing. Cancelled: stops watching."""
        code = await harness.proc.wait()
        await harness.wait_closed()
        self.note("harness_exit", name=harness.name, code=code,
                  expected=sorted(harness.expected) if harness.expected is not None else None)
        if harness.expected is None or code not in harness.expected:
            said = "no exit" if harness.expected is None else sorted(harness.expected)
            self.crash(f"{harness.name} exited with {code} (the soak expected {said}); "
                       f"see {harness.log_path.name}")
        for line in harness.tracebacks()[:1]:
            self.crash(f"{harness.name}: traceback in its log: {line.strip()[:120]}")
        harness.exited.set()
        if harness.expected is None and not self.ending:
            if len(self.crashes) > MAX_CRASHES:
                self.abort("the harness keeps exiting on its own; see the harness logs")
                return
            await self.start_harness()

    # ------------------------------------------------------------------ the whole soak

    async def drive(self) -> None:
        """Submit every run while a second task injects each fault once ``at_run``
        runs have settled (so the harness stays loaded while it is broken); then let
        everything be acked, drain the harness and stop the server."""
        await self.start_server()
        nursery = self._need_nursery()
        nursery.start_soon(self.poll)
        self.hold_path.write_text("held\n")
        await self.start_harness()
        async with trio.open_nursery() as both:
            both.start_soon(self._opening_burst)
            both.start_soon(self._submit_all)
            both.start_soon(self._inject_all)
        # Every run answered for by a harness (a forgotten completion never settles);
        # then a last drain reports what it holds and exits 0.
        await self.until(lambda: len(self.audit) == self.submitted
                         and all(map(_answered, self.audit.values())))
        self.note("all_acked")
        self.ending = True
        harness = self.harness
        if harness is not None and not harness.exited.is_set():
            await self._connected(harness)
            await self.signals(harness, [])
        await self._audit_changed.wait()  # one audit after the last report

    async def _opening_burst(self) -> None:
        """Every agent waits (the hold file) while the first runs are submitted, so
        the harness's queue fills and it refuses a delivery 503 "queue full" in every
        soak, whatever the machine's speed (the backlog, 4 x concurrency + 8 by default,
        is more than the concurrency plus --max-queued); then the agents go on.
        Cancelled: the hold file is removed all the same."""
        try:
            if self.backlog <= self.concurrency + self.max_queued:
                self.note("burst_skipped", why="--backlog is not more than the concurrency "
                          "plus --max-queued: the queue cannot fill")
                return
            with trio.move_on_after(BURST_WITHIN_S):
                await self.until(lambda: any(503 in run["ack_statuses"]
                                             for run in self.audit.values()))
        finally:
            self.hold_path.unlink(missing_ok=True)
        self.burst_refused = any(503 in run["ack_statuses"] for run in self.audit.values())
        self.note("burst_released", refused=self.burst_refused)

    async def _submit_all(self) -> None:
        """POST every run, keeping at most ``backlog`` unsettled. Cancelled: stops
        submitting; a run is submitted or not, never half."""
        for index, run in enumerate(self.plan["runs"]):
            await self.until(lambda index=index: index - self.settled() < self.backlog)
            answer = await self.call("POST", "/v1/runs", {
                "run_id": run["run_id"], "conversation_id": run["conversation_id"],
                "text": f"soak run {index}: answer with the reply for your run id"})
            # 409: the first try got through, but its answer was lost to a restart.
            if answer.status_code not in (201, 409):
                raise SoakAborted(f"submitting {run['run_id']} failed: {answer.text}")
            self.submitted += 1
        self.note("submitted", runs=self.submitted)

    async def _inject_all(self) -> None:
        """Every fault, in plan order, once its ``at_run`` runs have settled.
        Cancelled: no further fault fires."""
        for fault in self.plan["faults"]:
            await self.until(lambda fault=fault: fault["at_run"] <= self.settled()
                             or self._stalled())
            await self.inject(fault)

    def _stalled(self) -> bool:
        """Everything is submitted and nothing settled for a while: lost runs never
        settle, so a fault waiting for them fires anyway."""
        return (self.submitted == len(self.plan["runs"])
                and trio.current_time() - self._last_settle > LATE_FAULT_WAIT_S)

    async def run(self) -> verdict.Figures:
        """The whole soak, bounded by ``max_seconds``; the figures. Whatever ends it
        (the deadline, an abort, Ctrl-C), everything it started is killed, shielded,
        before it returns. Cancelled from outside: the same cleanup, then the cancel
        propagates."""
        self.out.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(mode=0o700, exist_ok=True)
        for folder in self.account_folders().values():
            folder.mkdir(parents=True, exist_ok=True)
        (self.out / "sleeps.json").write_text(json.dumps({
            "sleeps": {run["run_id"]: run["sleep_ms"] for run in self.plan["runs"]},
            "twice": self.plan["twice"]}))
        self.t0 = self._last_settle = trio.current_time()
        # A local file written a line at a time: blocking for microseconds is fine here.
        with open(self.out / "timeline.jsonl", "w", encoding="utf-8") as timeline:  # noqa: ASYNC230
            self._timeline = timeline
            try:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._obey_signals)
                    self._drive_scope.deadline = trio.current_time() + self.max_seconds
                    with self._drive_scope:
                        try:
                            await self.drive()
                        except SoakAborted as exc:
                            self.abort(str(exc))
                    self.timed_out = self.aborted is None and self._drive_scope.cancelled_caught
                    self.ending = True
                    await self._stop_everything()
                    nursery.cancel_scope.cancel()
            finally:
                with trio.CancelScope(shield=True):
                    self.hold_path.unlink(missing_ok=True)
                    self._kill_everything()
                    self.free_disk()
                    if self._client is not None:
                        with trio.move_on_after(2), contextlib.suppress(Exception):
                            await self._client.aclose()
            if self.timed_out:
                self.crash(f"the soak ran out of time (--max-seconds {self.max_seconds:g})")
            if self.aborted:
                self.crash(f"the soak stopped early: {self.aborted}")
            figures = self._figures()
            self.note("end", line=figures.line())
        return figures

    async def _obey_signals(self) -> None:
        """Ctrl-C or SIGTERM: stop driving and kill what the soak started (then the
        figures so far are printed). Cancelled: stops listening."""
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                self.interrupted = True
                self.abort(f"interrupted by {signal.Signals(signum).name}")

    async def _stop_everything(self) -> None:
        """End of the soak: the harness (if still up) and the server, by signal;
        after a Ctrl-C they are killed at once instead (by the caller)."""
        if self.interrupted:
            return
        with trio.move_on_after(EXIT_WITHIN_S) as scope:
            scope.shield = True
            harness = self.harness
            if harness is not None and not harness.exited.is_set():
                # Ran out of time or aborted: a stop, not a figure.
                harness.expected = frozenset({0, 130})
                harness.signal(signal.SIGTERM)
                harness.signal(signal.SIGTERM)
                await harness.exited.wait()
            server = self.server
            if server is not None and not server.exited.is_set():
                server.signal(signal.SIGTERM)
                await server.exited.wait()

    def _kill_everything(self) -> None:
        """Whatever still runs now was left behind: count it, then kill it."""
        self.left = [f"agent pid {pid}: {cmd[:100]}" for pid, cmd in
                     marked_processes(self.marker)]
        for child in [*self.harnesses, *([self.server] if self.server else [])]:
            if child.proc.returncode is None:
                self.left.append(f"{child.name} pid {child.pid} still running")
            child.kill_group()
        kill_marked(self.marker)

    def _figures(self) -> verdict.Figures:
        starts = verdict.read_starts(self.starts_path)
        lines = [verdict.judge_run(run, self.audit.get(run["run_id"]), starts[run["run_id"]],
                                   self.cancelled.get(run["run_id"]))
                 for run in self.plan["runs"]]
        with open(self.out / "runs.jsonl", "w", encoding="utf-8") as file:
            for line in lines:
                file.write(json.dumps(line) + "\n")
        figures = verdict.tally(self.plan, lines)
        figures.left = list(self.left)
        figures.crashes = list(self.crashes)
        self.outcomes = verdict.outcome_summary(lines)
        self.planned = fault_counts(self.plan)
        return figures
