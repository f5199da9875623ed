#!/usr/bin/env python3
"""How fast a delivery is acked while the harness is busy, against a WebSocket echo.

Usage: .venv/bin/python scripts/bench_ack.py [--samples N] [--queued N]

The harness runs at concurrency 16 with 16 agents busy (each a ``sleep``) and
``--queued`` more runs waiting in the scheduler. Then ``--samples`` deliveries are
sent one at a time from the reference server and timed from send to the ack's
arrival. The floor is a plain trio-websocket echo server on the same loopback,
timed the same way with a message of the same size, in the same process run. The
figure that matters is the ratio: what classification, the ledger's fsync'd write
and the ack cost on top of one network round trip, with the machine busy.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio
import trio_websocket

from prohost.engine.harness import Harness
from prohost.engine.ledger import Ledger
from prohost.engine.link.connection import Endpoints
from prohost.home import Credentials, resolve_endpoints
from prohost.options import Options
from prohost.server import ServerConfig, ServerHandle, serve
from prohost.wire.protocol import Ack
from prohost.wire.signature import sign

BUSY = 16


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def echo_round_trips(samples: int, size: int) -> list[float]:
    async def echo(request: trio_websocket.WebSocketRequest) -> None:
        ws = await request.accept()
        try:
            while True:
                await ws.send_message(await ws.get_message())
        except trio_websocket.ConnectionClosed:
            pass

    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            trio_websocket.serve_websocket, echo, "127.0.0.1", 0, None
        )
        port = server.port
        payload = "x" * size
        times: list[float] = []
        async with trio_websocket.open_websocket_url(f"ws://127.0.0.1:{port}/") as ws:
            for _ in range(samples):
                began = time.perf_counter()
                await ws.send_message(payload)
                await ws.get_message()
                times.append(time.perf_counter() - began)
        nursery.cancel_scope.cancel()
    return times


def delivery(secret: str, run_id: str, delivery_id: str) -> str:
    body = json.dumps({"run_id": run_id, "conversation_id": run_id, "text": "bench",
                       "completion_path": f"/v1/agent/runs/{run_id}/complete"})
    ts = int(time.time())
    return json.dumps({"type": "delivery", "id": delivery_id, "event": "agent.run",
                       "timestamp": ts, "signature": sign(secret, ts, body), "body": body})


async def ack_latencies(samples: int, queued: int, home: Path) -> tuple[list[float], int]:
    async with trio.open_nursery() as nursery:
        server: ServerHandle = await nursery.start(serve, ServerConfig())
        data = server.pair("bench")
        creds = Credentials(token=data["token"], secret=data["secret"], ws_url=data["ws_url"],
                            api_url=data["api_url"])
        ws_url, api_base = resolve_endpoints(None, creds)
        options = Options(home=home, machine="bench", exec_command="sleep 3600",
                          concurrency=BUSY)
        ledger = Ledger.open(home / "ledger.sqlite3")
        async with httpx.AsyncClient() as client:
            harness = Harness(options, Endpoints(ws_url, api_base, creds.token, creds.secret),
                              client=client, ledger=ledger)
            await nursery.start(harness.run)
            await server.wait_until(lambda s: s.connected > 0)
            for n in range(BUSY + queued):
                await server.submit_run("occupy", conversation_id=f"busy-{n}")
            await harness.wait_until(
                lambda h: h.scheduler.statistics().running == BUSY
                and h.scheduler.statistics().queued == queued
            )
            times: list[float] = []
            for n in range(samples):
                delivery_id = f"bench-{n}"
                frame = delivery(creds.secret, f"probe-{n}", delivery_id)
                began = time.perf_counter()
                await server.send_raw(frame)
                await server.wait_until(lambda s, d=delivery_id: any(
                    isinstance(r.message, Ack) and r.message.id == d for r in s.received[-4:]))
                times.append(time.perf_counter() - began)
            size = len(frame)
            nursery.cancel_scope.cancel()
        ledger.close()
    return times, size


async def main_async(samples: int, queued: int) -> None:
    with tempfile.TemporaryDirectory(prefix="prohost-bench-") as tmp:
        acks, size = await ack_latencies(samples, queued, Path(tmp))
    echoes = await echo_round_trips(samples, size)
    ack50, ack99 = percentile(acks, 0.50), percentile(acks, 0.99)
    echo50, echo99 = percentile(echoes, 0.50), percentile(echoes, 0.99)
    print(f"Python {platform.python_version()} on {platform.platform()}, "
          f"{os.cpu_count()} processors")
    print(f"{samples} deliveries of {size} bytes; {BUSY} runs busy, {queued} queued")
    print(f"ack     p50 {ack50 * 1e3:7.2f} ms   p99 {ack99 * 1e3:7.2f} ms   "
          f"mean {statistics.fmean(acks) * 1e3:.2f} ms")
    print(f"echo    p50 {echo50 * 1e3:7.2f} ms   p99 {echo99 * 1e3:7.2f} ms")
    print(f"ratio   p50 {ack50 / echo50:6.1f}×      p99 {ack99 / echo99:6.1f}×")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--queued", type=int, default=1000)
    args = parser.parse_args()
    # The probes are not runs the server submitted; its warnings about them are noise.
    logging.getLogger("prohost").setLevel(logging.ERROR)
    trio.run(main_async, args.samples, args.queued)


if __name__ == "__main__":
    sys.exit(main())
