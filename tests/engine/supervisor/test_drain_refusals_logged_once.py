"""A run offered again and again during a drain is logged once (issue 31 point 11):
the server retries a 503 within seconds, and "refused with 503" as a WARNING five
times in eight seconds read like five failures.

Real parts: the reference server on 127.0.0.1, the production harness, its ledger,
and the test-driven agent (:class:`tests.kits.harness.Gate`).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio

from prohost.engine import lognames
from prohost.server import state as server_state
from prohost.wire import intake
from tests.kits.harness import busy_and_queued, finished, gated_harness

pytestmark = pytest.mark.protocol("§9")


async def test_a_run_refused_again_and_again_in_a_drain_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server's first resend after a 503 comes this soon (it doubles each time).
    monkeypatch.setattr(server_state, "BUSY_RETRY_FIRST_S", 0.01)
    caplog.set_level(logging.DEBUG, lognames.HARNESS)
    with trio.fail_after(60):
        async with gated_harness(tmp_path) as (gate, running):
            server = running.server
            busy, _ = await busy_and_queued(server, gate)
            running.harness.drain()
            late = await server.submit_run("sent during the drain", conversation_id="L")
            await server.wait_until(
                lambda s: s.runs[late].ack_statuses.count(intake.DRAINING) >= 4)
            await gate.release(busy)
            await server.wait_until(finished(busy))
    refusals = [r for r in caplog.records
                if r.name == lognames.HARNESS and f"run {late} refused with 503" in r.getMessage()]
    assert len(refusals) >= 4
    assert [r.levelno for r in refusals[:1]] == [logging.INFO]
    assert all(r.levelno == logging.DEBUG for r in refusals[1:])
    assert "further offers are not logged" in refusals[0].getMessage()
