"""What the soak does to the harness and the server: every fault of the plan
(:data:`soaklib.plan.FAULT_RATES`), and the signals and kills with the exit status
each must end in. A mixin of :class:`soaklib.driver.Soak`, which owns the state."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import httpx
import trio

from soaklib import verdict
from soaklib.plan import ACCOUNTS
from soaklib.procs import Child

#: How long a harness may take to obey a first or second signal (seconds): a drain
#: waits for running agents (at most a few seconds here) and for their reports,
#: which a storm may hold back for a few backoff rounds.
EXIT_WITHIN_S = 90.0
#: How long to wait for a restarted harness's first line (seconds).
FIRST_LINE_WITHIN_S = 60.0
#: Before a kill -9 meant to leave runs running and queued, wait this long at most
#: for the harness to hold both (seconds).
BUSY_WITHIN_S = 5.0
#: How long a fault that signals or kills the harness waits for it to be connected
#: (seconds), so that it hits a working harness; then it fires anyway.
CONNECTED_WITHIN_S = 30.0


class Faults:
    """The fault half of the soak; see :class:`soaklib.driver.Soak` for the rest."""

    # Provided by Soak.
    harness: Child | None
    #: Runs the soak cancelled once they had started, and the harness held the
    #: cancel: how many times the agent had started each then (§6: never again).
    cancelled: dict[str, int]
    home: Path
    starts_path: Path
    audit: dict[str, dict[str, Any]]
    injected: dict[str, int]

    def note(self, event: str, **details: Any) -> None:
        raise NotImplementedError

    def crash(self, what: str) -> None:
        raise NotImplementedError

    def held(self) -> list[str]:
        raise NotImplementedError

    async def call(self, method: str, path: str, payload: Any = None) -> httpx.Response:
        raise NotImplementedError

    async def until(self, predicate: Any) -> None:
        raise NotImplementedError

    async def start_harness(self) -> Child:
        raise NotImplementedError

    async def limit(self, names: list[str], holds: list[float]) -> None:
        raise NotImplementedError

    async def disk_full(self, hold_s: float) -> None:
        raise NotImplementedError

    async def _exit_of(self, harness: Child, what: str) -> int | None:
        """The harness's exit status once it has exited; None (a crash: it did not
        obey) if it is still running EXIT_WITHIN_S later, when it is killed.
        Cancelled: stops waiting."""
        with trio.move_on_after(EXIT_WITHIN_S):
            await harness.exited.wait()
            return harness.proc.returncode
        self.crash(f"{harness.name} did not exit within {EXIT_WITHIN_S:g} s of {what}")
        harness.expected = frozenset({-signal.SIGKILL})
        harness.signal(signal.SIGKILL)
        await harness.exited.wait()
        return None

    def check_drained_ledger(self, harness: Child) -> None:
        """A drain that exits 0 must leave nothing unreported in the ledger (§9)."""
        rows = verdict.unreported_rows(self.home)
        self.note("ledger_after_drain", name=harness.name, unreported=rows[:20],
                  count=len(rows))
        if rows:
            self.crash(f"{harness.name} drained and exited 0 with {len(rows)} run(s) "
                       f"unreported in its ledger, e.g. {rows[0]}")

    async def kill9(self, *, busy: bool) -> None:
        """kill -9 the harness (its agents live on, for the next start to find); with
        ``busy``, first wait (bounded) until it holds runs running and queued.
        Cancelled: the kill was sent or not; the exit is noted by its watcher."""
        harness = self.harness
        if harness is None or harness.exited.is_set():
            return
        if busy:  # leave runs both running and queued behind
            with trio.move_on_after(BUSY_WITHIN_S):
                await self.until(self._running_and_queued)
        started = verdict.read_starts(self.starts_path)
        held = self.held()
        self.note("kill9", name=harness.name, held=len(held),
                  started_unreported=sum(1 for r in held if r in started))
        harness.expected = frozenset({-signal.SIGKILL})
        harness.signal(signal.SIGKILL)
        await harness.exited.wait()

    def _running_and_queued(self) -> bool:
        started = verdict.read_starts(self.starts_path)
        held = self.held()
        return any(r in started for r in held) and any(r not in started for r in held)

    async def signals(self, harness: Child, gaps_ms: list[int]) -> int | None:
        """SIGTERM, then one more SIGTERM after each gap; the exit status (None if it
        had to be killed), and after a 0 the ledger check. Cancelled: the signals
        sent stay sent; the harness is left to the end-of-soak cleanup."""
        harness.expected = frozenset({0} if len(gaps_ms) == 0 else {0, 130})
        harness.signal(signal.SIGTERM)
        self.note("sigterm", name=harness.name)
        for gap in gaps_ms:
            await trio.sleep(gap / 1000)
            harness.signal(signal.SIGTERM)
            self.note("sigterm", name=harness.name, after_ms=gap)
        code = await self._exit_of(harness, "SIGTERM")
        if code == 0:
            self.check_drained_ledger(harness)
        return code

    # ------------------------------------------------------------------ faults

    async def inject(self, fault: dict[str, Any]) -> None:
        """Inject one fault of the plan and note it in the timeline. Cancelled: the
        fault may be half done (a harness killed, not restarted); the soak is ending."""
        kind = fault["kind"]
        self.note("fault", **fault)
        if kind == "drop":
            answer = await self.call("POST", "/v1/faults/drop")
            self.note("dropped", answer=answer.json())
        elif kind == "restart":
            await self.call("POST", "/v1/faults/restart", {"down_s": fault["down_s"]})
        elif kind == "storm":
            await self.call("POST", "/v1/faults/storm", {
                key: fault[key] for key in ("status", "count", "retry_after")
                if fault[key] is not None})
        elif kind == "forget":
            await self.call("POST", "/v1/faults/forget", {"count": 1})
        elif kind == "redeliver":
            await self._connected(self.harness)
            await self._redeliver(fault)
        elif kind == "kill":
            await self._connected(self.harness)
            await self.kill9(busy=False)
            await self.start_harness()
        elif kind == "recover_term":
            await self._recover_term(fault)
        elif kind == "limit":
            await self.limit([fault["account"]], [fault["hold_s"]])
        elif kind == "limit_both":
            await self.limit(list(ACCOUNTS),
                             [fault["hold_s"], fault["hold_s"] + fault["stagger_s"]])
        elif kind == "disk_full":
            # On a harness that is up: one still starting needs the disk for its
            # lock and ledger, and cannot start on a full one (it exits, as it must).
            await self._connected(self.harness)
            await self.disk_full(fault["hold_s"])
        elif kind in ("cancel_drain", "cancel_stop", "cancel_kill"):
            await self._cancel_then(fault)
        elif kind in ("drain", "stop"):
            harness = self.harness
            await self._connected(harness)
            if harness is not None and not harness.exited.is_set():
                await self.signals(harness, [] if kind == "drain" else [fault["gap_ms"]])
                await self.start_harness()
        else:
            raise ValueError(f"soak bug: unknown fault {kind!r}")
        name = kind if kind != "redeliver" else f"redeliver_{fault['target']}"
        self.injected[name] = self.injected.get(name, 0) + 1

    async def _connected(self, harness: Child | None) -> None:
        """Wait (bounded) until ``harness`` has said it is connected, or has exited.
        Cancelled: stops waiting."""
        if harness is None:
            return
        with trio.move_on_after(CONNECTED_WITHIN_S) as scope:
            async with trio.open_nursery() as nursery:
                async def on_line() -> None:
                    await harness.wait_line(lambda line: "connected to" in line)
                    nursery.cancel_scope.cancel()

                async def on_exit() -> None:
                    await harness.exited.wait()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(on_line)
                nursery.start_soon(on_exit)
        if scope.cancelled_caught:
            self.note("not_connected", name=harness.name, waited_s=CONNECTED_WITHIN_S)

    async def _redeliver(self, fault: dict[str, Any]) -> None:
        """Deliver once more a run held now (in flight, or reported), picked by the
        plan's ``pick`` among those. Cancelled: sent or not."""
        if fault["target"] == "inflight":
            candidates = self.held()
        else:
            candidates = sorted(r for r, run in self.audit.items() if run["completion"])
        if not candidates:
            self.note("redeliver_skipped", target=fault["target"], why="no such run now")
            return
        run_id = candidates[min(len(candidates) - 1, int(fault["pick"] * len(candidates)))]
        answer = await self.call("POST", "/v1/faults/redeliver", {"run_id": run_id})
        self.note("redelivered", run_id=run_id, status=answer.status_code,
                  answer=answer.json())

    async def _cancel_then(self, fault: dict[str, Any]) -> None:
        """Cancel a running run through the server's API and, once the harness holds
        the cancel (its log says so), drain, stop or kill -9 it, then start it again.
        The run must be reported cancelled, not retryable, and never start again
        (issue 37): :func:`soaklib.verdict.judge_run`. Cancelled: as :meth:`inject`."""
        harness = self.harness
        await self._connected(harness)
        if harness is None or harness.exited.is_set():
            return
        with trio.move_on_after(BUSY_WITHIN_S):
            await self.until(lambda: bool(self._running()))
        running = self._running()
        if not running:
            self.note("cancel_skipped", why="no run running now")
            return
        run_id = running[0]
        starts = verdict.read_starts(self.starts_path)[run_id]
        answer = await self.call("DELETE", f"/v1/runs/{run_id}")
        held = None
        with trio.move_on_after(CONNECTED_WITHIN_S):
            held = await harness.wait_line(
                lambda line: f"cancelling run {run_id}" in line
                or f"cancel for run {run_id}" in line)
        holds = held is not None and "cancelling run" in held
        self.note("cancelled", run_id=run_id, status=answer.status_code, held=holds,
                  starts=starts)
        if holds:
            self.cancelled[run_id] = starts
        if harness.exited.is_set():
            return
        if fault["kind"] == "cancel_kill":
            await self.kill9(busy=False)
        else:
            code = await self.signals(
                harness, [] if fault["kind"] == "cancel_drain" else [fault["gap_ms"]])
            self.note("cancel_signal_exit", name=harness.name, code=code)
        await self.start_harness()

    def _running(self) -> list[str]:
        """Runs held now whose agent has started (and not yet reported)."""
        started = verdict.read_starts(self.starts_path)
        return [run_id for run_id in self.held() if run_id in started]

    async def _recover_term(self, fault: dict[str, Any]) -> None:
        """kill -9 with runs running and queued, start again, and signal it while it
        recovers its ledger (issue 8, reproduction 8); then start it again.
        Cancelled: as :meth:`inject`."""
        await self._connected(self.harness)
        await self.kill9(busy=True)
        harness = await self.start_harness()
        with trio.move_on_after(FIRST_LINE_WITHIN_S):
            await harness.wait_line(lambda line: True)
        await trio.sleep(fault["delay_ms"] / 1000)
        gaps = [] if fault["second_ms"] is None else [fault["second_ms"]]
        code = await self.signals(harness, gaps)
        self.note("recover_term_exit", name=harness.name, code=code)
        await self.start_harness()
