"""A first signal while a restarted harness is still reading its ledger (issue 8,
reproduction 8), or before the harness has even started (reproduction 9).

In process and deterministic: the ledger handed to the harness is the real sqlite
file wrapped so that ``recover`` (which runs in a worker thread) waits until the
test has called ``drain()`` — exactly what the first SIGTERM does — so the drain
lands in the middle of the recovery every time, with no timing window to race.
The reports go to the reference server on 127.0.0.1.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from prohost.engine.harness import Harness
from prohost.engine.ledger import Ledger, RunState, UnreportedRuns
from prohost.home import Credentials
from prohost.options import Options
from prohost.server import ServerHandle
from prohost.wire.outcomes import INTERRUPTED, NOT_STARTED, RESTARTED
from prohost.wire.runs import Outcome, parse_body
from tests.kits.harness import endpoints_for, finished, pair_home, running_server

pytestmark = pytest.mark.protocol("§7", "§9")


class PausedRecovery:
    """The real ledger, except that ``recover`` tells the test it has begun and then
    waits for the test to let it go on."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self.reading = trio.Event()
        self.go_on = trio.Event()

    def recover(self) -> UnreportedRuns:
        # In the harness's worker thread: these hop back to the trio loop.
        trio.from_thread.run_sync(self.reading.set)
        trio.from_thread.run(self.go_on.wait)
        return self._ledger.recover()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)


def admit(ledger: Ledger, server: ServerHandle, run_id: str, now: float) -> None:
    """Write the server's run into the ledger as accepted, as the harness does on its
    delivery."""
    body = server.run(run_id).body_text
    ledger.admit(run_id, parse_body(body).lane, body, now)


def harness_with(
    home: Path, creds: Credentials, client: httpx.AsyncHTTPTransport, ledger: Any
) -> Harness:
    """A harness on ``home`` whose agent would fail at once, with ``ledger`` (the real
    one, or a test's wrapper around it: hence ``Any``)."""
    return Harness(Options(home=home, machine="test", exec_command="false"),
                   endpoints_for(creds), client=client, ledger=ledger)


def leave_a_crashed_ledger(server: ServerHandle, path: Path) -> dict[str, str]:
    """The ledger a ``kill -9`` leaves: one run accepted and never started, one
    interrupted while running, one finished but not yet reported. Returns their ids."""
    runs = {
        "queued": server.state.add_run("never started", "A").run_id,
        "interrupted": server.state.add_run("was running", "B").run_id,
        "outbox": server.state.add_run("had finished", "C").run_id,
    }
    now = time.time()
    with Ledger.open(path) as ledger:
        for run_id in runs.values():
            admit(ledger, server, run_id, now)
        ledger.mark_started(runs["interrupted"], now)
        ledger.mark_started(runs["outbox"], now)
        ledger.mark_finished(runs["outbox"], Outcome(ok=True, reply="the saved answer")
                             .to_json(), now)
    return runs


@pytest.mark.parametrize("when", ["during_recovery", "before_run"])
async def test_a_drain_while_recovering_reports_every_recovered_run_then_exits_0(
    tmp_path: Path, when: str
) -> None:
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with running_server() as server:
            creds = pair_home(server, home)
            runs = leave_a_crashed_ledger(server, home / "ledger.sqlite3")
            ledger = Ledger.open(home / "ledger.sqlite3")
            paused = PausedRecovery(ledger)
            exit_codes: list[int] = []
            try:
                async with httpx.AsyncHTTPTransport() as client, trio.open_nursery() as nursery:
                    harness = harness_with(home, creds, client, paused)

                    async def run_it() -> None:
                        exit_codes.append(await harness.run())

                    if when == "before_run":
                        # A signal before the supervisor is up (while the panel starts).
                        harness.drain()
                    nursery.start_soon(run_it)
                    await paused.reading.wait()
                    if when == "during_recovery":
                        harness.drain()
                    paused.go_on.set()
            finally:
                ledger.close()

            assert exit_codes == [0]
            # Every recovered run was reported as §9 says, before the harness exited.
            assert finished(*runs.values())(server.state)
            assert server.run(runs["queued"]).completion == {
                "run_id": runs["queued"], "ok": False, "error": NOT_STARTED,
                "retryable": True}
            # A run interrupted by the restart says how long it ran (§7).
            interrupted = dict(server.run(runs["interrupted"]).completion or {})
            assert isinstance(interrupted.pop("duration_ms"), int)
            assert interrupted == {
                "run_id": runs["interrupted"], "ok": False, "error": RESTARTED,
                "retryable": True}
            outbox = server.run(runs["outbox"]).completion
            assert outbox is not None and outbox["reply"] == "the saved answer"
            with Ledger.open(home / "ledger.sqlite3") as after:
                assert after.recover() == UnreportedRuns(pending=[], interrupted=[], outbox=[])
                for run_id in runs.values():
                    row = after.get(run_id)
                    assert row is not None and row.state is RunState.REPORTED


async def test_a_run_left_unreported_in_the_ledger_is_reported_before_a_drain_exits(
    tmp_path: Path,
) -> None:
    """A row nobody holds (here: written behind the harness's back, as a delivery
    whose ledger write raced the drain would be) is reported by the drain's last
    sweep: a drain that exits 0 leaves nothing unreported in the ledger."""
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with running_server() as server:
            creds = pair_home(server, home)
            ledger = Ledger.open(home / "ledger.sqlite3")
            try:
                async with httpx.AsyncHTTPTransport() as client:
                    harness = harness_with(home, creds, client, ledger)
                    async with trio.open_nursery() as nursery:
                        codes: list[int] = []

                        async def run_it(*, task_status: trio.TaskStatus[None]) -> None:
                            codes.append(await harness.run(task_status=task_status))

                        await nursery.start(run_it)
                        late = server.state.add_run("raced the drain", "L").run_id
                        stray = server.state.add_run("started, then lost", "S").run_id
                        for run_id in (late, stray):
                            admit(ledger, server, run_id, time.time())
                        ledger.mark_started(stray, time.time())
                        harness.drain()
            finally:
                ledger.close()
            assert codes == [0]
            assert server.run(late).completion == {
                "run_id": late, "ok": False, "error": NOT_STARTED, "retryable": True}
            swept = dict(server.run(stray).completion or {})
            assert isinstance(swept.pop("duration_ms"), int)
            assert swept == {
                "run_id": stray, "ok": False, "error": INTERRUPTED, "retryable": True}
            with Ledger.open(home / "ledger.sqlite3") as after:
                assert after.recover() == UnreportedRuns(pending=[], interrupted=[], outbox=[])


async def test_a_drain_that_cannot_report_says_which_runs_stay_in_the_outbox(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The server refuses every report and the reporter gives up: the run is then
    settled as failed-to-report; but a run whose report never settled (the outbox)
    is named in the log, and the exit is still 0 — the next start reports it."""
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with running_server() as server:
            creds = pair_home(server, home)
            ledger = Ledger.open(home / "ledger.sqlite3")
            try:
                run_id = server.state.add_run("finished, report lost", "O").run_id
                admit(ledger, server, run_id, time.time())
                ledger.mark_started(run_id, time.time())
                ledger.mark_finished(run_id, Outcome(ok=True, reply="r").to_json(),
                                     time.time())

                class NoSettling:
                    """mark_reported fails: the row stays in the outbox."""

                    def mark_reported(self, *args: object) -> None:
                        from prohost.engine.ledger import LedgerError
                        raise LedgerError("disk full (test)")

                    def __getattr__(self, name: str) -> Any:
                        return getattr(ledger, name)

                async with httpx.AsyncHTTPTransport() as client:
                    harness = harness_with(home, creds, client, NoSettling())
                    harness.drain()
                    assert await harness.run() == 0
            finally:
                ledger.close()
            completion = server.run(run_id).completion
            assert completion is not None and completion["reply"] == "r"
            assert f"run {run_id} could not be reported now; it stays in the ledger's " \
                   "outbox" in caplog.text
