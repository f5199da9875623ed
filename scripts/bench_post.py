"""CPU per completion POST: another tree's reporter, this tree's, and a plain client.post.

    .venv/bin/python scripts/bench_post.py --before /work/main [--posts 1000]
        [--rounds 7] [--concurrency 16]

Posts ``--posts`` completions of about 600 bytes, ``--concurrency`` at a time, to a
minimal ASGI app under hypercorn's trio worker in a process of its own (bench_e2e's
MINIMAL_APP), and reports this process's CPU (``time.process_time``) per POST for:

- before: ``Reporter.complete`` loaded from ``--before``'s tree, over ``httpx.AsyncClient()``
  (as that tree's harness makes it);
- after: this tree's ``Reporter.complete``, over what this tree's harness posts
  through (``open_sender()``);
- plain: ``httpx.AsyncClient.post`` of the same body and headers.

The three alternate within each round, after one warm-up round; medians over the
rounds, with the load average (the machine may be shared). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import trio
from bench_e2e import MINIMAL_APP  # scripts/ is on the path: this is run as a script

from prohost.engine.report.reporter import Reporter
from prohost.engine.report.sender import open_sender

TOKEN = "tok_bench_post"
PAYLOAD: dict[str, Any] = {
    "ok": True,
    "reply": "Fixed the fixture path and re-ran the suite: all green. " * 9,
    "usage": {"input_tokens": 1234, "output_tokens": 567},
}


def _load_reporter(tree: Path) -> ModuleType:
    """``prohost/engine/report/reporter.py`` of ``tree``, as a module of its own."""
    path = tree / "prohost" / "engine" / "report" / "reporter.py"
    spec = importlib.util.spec_from_file_location("before_reporter", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"bench_post: no reporter at {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


async def _cpu_per_post(
    post: Callable[[str], Awaitable[None]], count: int, concurrency: int
) -> float:
    """Milliseconds of this process's CPU per POST over ``count`` POSTs."""
    left = count

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await post(f"run_{left:06d}")

    began = time.process_time()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    return (time.process_time() - began) / count * 1000


async def _bench(args: argparse.Namespace) -> dict[str, list[float]]:
    before_module = _load_reporter(Path(args.before))
    app = await trio.lowlevel.open_process(
        [sys.executable, "-c", MINIMAL_APP], stdout=subprocess.PIPE, cwd=os.getcwd()
    )
    try:
        assert app.stdout is not None
        data = b""
        with trio.fail_after(30):
            while b"\n" not in data:
                chunk = await app.stdout.receive_some()
                if not chunk:
                    raise SystemExit("bench_post: the minimal app exited")
                data += chunk
        base = data.decode().split()[0]
        figures: dict[str, list[float]] = {"before": [], "after": [], "plain": []}
        async with httpx.AsyncClient() as before_client, open_sender() as sender, \
                httpx.AsyncClient() as plain_client:
            before = before_module.Reporter(before_client, base, TOKEN)
            after = Reporter(sender, base, TOKEN)

            async def post_before(run_id: str) -> None:
                path = f"/v1/agent/runs/{run_id}/complete"
                settled = await before.complete(run_id, path, {**PAYLOAD, "run_id": run_id})
                assert settled.kind == "delivered", settled

            async def post_after(run_id: str) -> None:
                path = f"/v1/agent/runs/{run_id}/complete"
                settled = await after.complete(run_id, path, {**PAYLOAD, "run_id": run_id})
                assert settled.kind == "delivered", settled

            async def post_plain(run_id: str) -> None:
                content = json.dumps({**PAYLOAD, "run_id": run_id}, separators=(",", ":"))
                response = await plain_client.post(
                    f"{base}/v1/agent/runs/{run_id}/complete", content=content.encode(),
                    headers={"Authorization": f"Bearer {TOKEN}", "Idempotency-Key": run_id,
                             "Content-Type": "application/json"})
                response.raise_for_status()

            sides = (("before", post_before), ("after", post_after), ("plain", post_plain))
            for _, post in sides:  # warm-up: connections open, code paths loaded
                await _cpu_per_post(post, min(args.posts, 200), args.concurrency)
            for round_no in range(args.rounds):
                # Alternate the order too, so no side always runs first.
                order = sides if round_no % 2 == 0 else tuple(reversed(sides))
                for name, post in order:
                    figures[name].append(
                        await _cpu_per_post(post, args.posts, args.concurrency))
        return figures
    finally:
        app.kill()
        await app.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the other tree (e.g. main's)")
    parser.add_argument("--posts", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    load_start = os.getloadavg()
    figures = trio.run(_bench, args)
    load_end = os.getloadavg()
    print(f"{args.posts} POSTs x {args.rounds} rounds, concurrency {args.concurrency}; "
          f"load average {load_start[0]:.2f} at start, {load_end[0]:.2f} at end")
    for name, values in figures.items():
        print(f"  {name:6} median {statistics.median(values):.3f} ms CPU/POST  "
              f"(rounds: {' '.join(f'{v:.3f}' for v in values)})")
    ratio = statistics.median(figures["after"]) / statistics.median(figures["before"])
    print(f"  after/before {ratio:.2f}")


if __name__ == "__main__":
    main()
