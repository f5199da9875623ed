"""The ledger's writer thread outlives a bug in its own loop (issue 27, point 5).

Before, an unexpected exception ended the thread while the ledger still said it
served: every later step waited its whole 30 s bound and failed, and nothing
started it again. Now what that round held fails at once, the loop goes on, and
the next writes are applied promptly and durably; a loop that cannot take anything
at all, round after round, gives the work back to worker threads, and says so.

Real parts: a sqlite file, the ledger's real writer thread, and an exception raised
inside that thread's loop. "Promptly" is a bound far below the 30 s a step waited
before (``trio.fail_after`` on the real clock: nothing here sleeps).
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from prohost.engine.blocking import Bounds
from prohost.engine.ledger import Admitted, Ledger, LedgerError
from prohost.engine.ledger.served import FAILURES_BEFORE_FALLBACK, ServedCommit
from prohost.engine.ledger.steps import LEDGER_STEP_TIMEOUT_S, LedgerSteps

WRITER = "prohost ledger writer"
#: Far below the step's bound: a step that waited for a dead thread fails this.
PROMPTLY_S = 5.0
assert PROMPTLY_S < LEDGER_STEP_TIMEOUT_S


def writer_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == WRITER]


def accepted(path: Path) -> set[str]:
    """The runs another connection reads in the file: committed."""
    with sqlite3.connect(path) as other:
        return {run_id for (run_id,) in other.execute("SELECT run_id FROM runs")}


def failing(monkeypatch: pytest.MonkeyPatch, name: str, times: int) -> list[int]:
    """``ServedCommit.<name>`` raises in the writer thread its first ``times`` calls."""
    real = getattr(ServedCommit, name)
    calls: list[int] = []

    def injected(self: ServedCommit, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) <= times and threading.current_thread().name == WRITER:
            raise RuntimeError(f"injected into {name} (test)")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ServedCommit, name, injected)
    return calls


@pytest.mark.protocol("§7")
@pytest.mark.parametrize("where", ["before a batch", "inside a batch"])
async def test_the_writer_thread_goes_on_after_an_exception_in_its_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    where: str,
) -> None:
    path = tmp_path / "ledger.sqlite3"
    with Ledger.open(path) as ledger:
        steps = LedgerSteps(ledger, Bounds())
        async with trio.open_nursery() as nursery:
            await nursery.start(steps.writer)
            [thread] = writer_threads()
            failing(monkeypatch, "_take_and_apply" if where == "before a batch" else "_apply",
                    times=1)
            with trio.fail_after(PROMPTLY_S):
                if where == "before a batch":
                    # Nothing was taken: the write stays queued and goes through.
                    assert await steps.admit("r1", "lane", "{}") is Admitted.NEW
                else:
                    # The batch under way is failed at once, its write undone.
                    with pytest.raises(LedgerError, match="writer thread failed"):
                        await steps.admit("r1", "lane", "{}")
                    assert "r1" not in accepted(path)
                for n in (2, 3, 4):
                    assert await steps.admit(f"r{n}", "lane", "{}") is Admitted.NEW
            # By the same thread, still serving; and in the file.
            assert writer_threads() == [thread] and ledger.serving
            assert {"r2", "r3", "r4"} <= accepted(path)
            nursery.cancel_scope.cancel()
        assert writer_threads() == []
    assert "the ledger's writer thread failed" in caplog.text
    with Ledger.open(path) as reopened:
        pending = {row.run_id for row in reopened.recover().pending}
    assert {"r2", "r3", "r4"} <= pending


@pytest.mark.protocol("§7")
async def test_a_writer_thread_that_keeps_failing_hands_the_writes_to_worker_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path / "ledger.sqlite3"
    with Ledger.open(path) as ledger:
        steps = LedgerSteps(ledger, Bounds())
        async with trio.open_nursery() as nursery:
            await nursery.start(steps.writer)
            [thread] = writer_threads()
            failing(monkeypatch, "_take_and_apply", times=10 * FAILURES_BEFORE_FALLBACK)
            with trio.fail_after(PROMPTLY_S):
                # Queued by the thread before it gave up: it leads the plain group
                # commit once on its way out, and applies it.
                assert await steps.admit("r1", "lane", "{}") is Admitted.NEW
                await trio.to_thread.run_sync(thread.join, PROMPTLY_S)
                assert not thread.is_alive() and not ledger.serving
                assert await steps.admit("r2", "lane", "{}") is Admitted.NEW
                assert await steps.admit("r3", "lane", "{}") is Admitted.NEW
            assert {"r1", "r2", "r3"} <= accepted(path)
            nursery.cancel_scope.cancel()
    assert "fall back to worker threads" in caplog.text
