"""Timeline batching (§8): a post at most every 500 ms, everything before close."""

from __future__ import annotations

import httpx
import pytest
import trio
import trio.testing

from prohost.engine.report.reporter import Reporter
from prohost.engine.report.timeline import BATCH_INTERVAL_S, TimelineBatcher
from prohost.wire.timeline import ToolEvent
from tests.kits.harness import running_server

pytestmark = pytest.mark.protocol("§8")


def event(n: int, state: str = "calling") -> ToolEvent:
    return ToolEvent(id=f"toolu_{n}", name="Bash", state=state,  # type: ignore[arg-type]
                     summary=f"step {n}", at=1764668400.0 + n)


async def test_events_are_batched_and_all_posted_before_close(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(60):
        async with running_server() as server, httpx.AsyncHTTPTransport() as client:
            token = server.pair("t")["token"]
            run_id = await server.submit_run("hi")
            path = server.run(run_id).body["timeline_path"]
            batcher = TimelineBatcher(Reporter(client, server.http_url, token), run_id, path)
            posts: list[tuple[float, int]] = []

            def seen(state: object) -> bool:
                size = len(server.run(run_id).timeline)
                if not posts or posts[-1][1] != size:
                    posts.append((trio.current_time(), size))
                return False

            async with trio.open_nursery() as nursery:
                nursery.start_soon(server.wait_until, seen)
                await nursery.start(batcher.run)
                began = trio.current_time()
                batcher.add([event(1), event(1, "done"), event(2)])
                await trio.sleep(0.1)
                batcher.add([event(2, "done")])
                await trio.sleep(0.05)
                batcher.add([event(3)])
                await batcher.close()
                nursery.cancel_scope.cancel()
            timeline = server.run(run_id).timeline
            assert [(e["id"], e["state"]) for e in timeline] == [
                ("toolu_1", "calling"), ("toolu_1", "done"), ("toolu_2", "calling"),
                ("toolu_2", "done"), ("toolu_3", "calling")]
            # Two posts: the first batch at once, the rest one interval later.
            growth = [(at - began, size) for at, size in posts if size]
            assert [size for _, size in growth] == [3, 5]
            assert growth[1][0] - growth[0][0] >= BATCH_INTERVAL_S
