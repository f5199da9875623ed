"""The reference server keeps the README's promise that nothing is lost (issue 31
point 3): a run a draining harness hands back "not started" (retryable, §9) is
submitted again as a new run after its backoff and runs on the next harness that
connects — here the same home, restarted, whose ledger would answer the old run_id
204 and never run it.

Real parts: the reference server on 127.0.0.1, the production harness (twice, on one
home), the sqlite ledger and the test-driven agent (:class:`tests.kits.harness.Gate`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from prohost.commands.send import send_command
from prohost.server.state import ServerState
from prohost.wire.outcomes import NOT_STARTED
from tests.kits.harness import Gate, busy_and_queued, finished, running_harness, running_server

pytestmark = pytest.mark.protocol("§11")


@pytest.mark.protocol("§9")
async def test_a_run_handed_back_at_a_drain_runs_on_the_next_harness(tmp_path: Path) -> None:
    gate = Gate()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(gate.serve)
            async with running_server(retries=2, retry_first_s=0.05) as server:
                async with running_harness(server, tmp_path, exec_command=gate.command) as first:
                    busy, [handed_back] = await busy_and_queued(server, gate, "B")
                    first.harness.drain()
                    await server.wait_until(finished(handed_back))
                    original = server.run(handed_back)
                    assert original.state == "failed"
                    assert original.error == NOT_STARTED
                    retry_id = original.retried_as
                    assert retry_id is not None
                    await gate.release(busy)
                    assert await first.wait_exit() == 0
                retry = server.run(retry_id)
                assert retry.retry_of == handed_back and retry.attempt == 2
                assert retry.conversation_id == "B"
                assert retry.body["text"] == original.body["text"]
                assert retry.state in ("queued", "delivered")

                async with running_harness(server, tmp_path, exec_command=gate.command):
                    await gate.wait_started(retry_id)
                    await gate.release(retry_id, "done the second time")
                    await server.wait_until(finished(retry_id))
                assert server.run(retry_id).reply == "done the second time"
                view = server.state.run_view(original)
                assert view["retried_as"] == retry_id
            nursery.cancel_scope.cancel()


async def test_retries_stop_after_the_limit_and_are_off_by_default() -> None:
    async with running_server(retries=1, retry_first_s=0.05) as server:
        state: ServerState = server.state
        first = state.add_run("hello", "C")
        state.record_completion(first, {"ok": False, "error": "x", "retryable": True})
        assert first.retried_as is not None
        second = state.runs[first.retried_as]
        state.record_completion(second, {"ok": False, "error": "x", "retryable": True})
        assert second.retried_as is None  # its one retry was spent
        third = state.add_run("hello", "C")
        state.record_completion(third, {"ok": False, "error": "x", "retryable": False})
        assert third.retried_as is None  # not retryable: the failure is the end
    async with running_server() as server:
        run = server.state.add_run("hello", "C")
        server.state.record_completion(run, {"ok": False, "error": "x", "retryable": True})
        assert run.retried_as is None


async def test_send_wait_follows_the_retry_to_its_reply(
    capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    async with running_server(retries=1, retry_first_s=0.05, token_dir=tmp_path) as server:
        state = server.state
        status: list[int] = []
        async with trio.open_nursery() as nursery:

            async def send() -> None:
                status.append(await send_command(server.http_url, "hi", "C", wait=True,
                                                 timeout_s=30, server_state=str(tmp_path)))

            nursery.start_soon(send)
            await server.wait_until(lambda s: len(s.runs) == 1)
            [first] = state.runs.values()
            state.record_completion(first, {"ok": False, "error": NOT_STARTED,
                                            "retryable": True})
            assert first.retried_as is not None
            state.record_completion(state.runs[first.retried_as],
                                    {"ok": True, "reply": "second time lucky"})
    assert status == [0]
    out, err = capsys.readouterr()
    assert out.splitlines() == [first.run_id, "second time lucky"]
    assert f"the server retries it as {first.retried_as}; waiting for that" in err


async def test_each_retry_waits_twice_as_long_as_the_one_before() -> None:
    # Issue 37 point 11: the backoff doubles (1 s, 2 s, 4 s), capped.
    async with running_server(retries=4, retry_first_s=1.0) as server:
        state: ServerState = server.state
        state.clock = lambda: 1000.0
        run = state.add_run("hello", "C")
        waits = []
        for _ in range(3):
            state.record_completion(run, {"ok": False, "error": "x", "retryable": True})
            assert run.retried_as is not None
            run = state.runs[run.retried_as]
            assert run.due_at is not None
            waits.append(run.due_at - 1000.0)
    assert waits == [1.0, 2.0, 4.0]
