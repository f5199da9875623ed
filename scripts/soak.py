#!/usr/bin/env python3
"""A chaos soak of ``prohost agent run``: exactly once under every fault at once (issue 10).

Usage: .venv/bin/python scripts/soak.py [--runs 1000] [--seed N] [--concurrency 4]
       [--conversations K] [--max-seconds S] [--out DIR] [--self-check]

A real reference server (``prohost server --faults``) and a real harness (plain
brain, a stand-in agent that records every start) on 127.0.0.1. The plan, drawn
from ``--seed``, submits ``--runs`` runs over ``--conversations`` conversations
and injects at random: socket drops, listener restarts (same port), completion
storms (408/429 with Retry-After/500/502/503), kill -9 and restart on the same
$PROHOST_HOME, first-signal drains, second-signal stops (20-250 ms after the
first), a SIGTERM while a restarted harness recovers its ledger, and
redeliveries of runs in flight and already reported. At the end it prints:

    soak: N runs, L lost, D run twice, B bad reports, P processes left, C crashes

and exits 0 only if all five are 0. ``--out DIR`` keeps the plan, the fault
timeline (timeline.jsonl), one line per run (runs.jsonl), every process's log
and the harness's home. ``--self-check`` breaks two promises on purpose (an
agent that starts three runs twice, a server that forgets one completion) and
exits 0 only if the soak sees both. See docs/reliability.md, "Soak".
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from soaklib.driver import Soak
from soaklib.plan import digest, fault_counts, make_plan

#: Problems listed per figure at the end (the rest are in runs.jsonl / timeline.jsonl).
#: What a harness logs when it refuses a new run because its queue is full.
QUEUE_FULL_LINE = "runs are already queued"
SHOW = 5


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="soak.py", description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=None,
                        help="runs to submit (default 1000; 40 with --self-check)")
    parser.add_argument("--seed", type=int, default=None,
                        help="the plan's seed (default: a random one, printed)")
    parser.add_argument("--conversations", type=int, default=None,
                        help="conversations the runs are spread over (default runs/20)")
    parser.add_argument("--concurrency", type=int, default=4,
                        help="the harness's --concurrency (default 4)")
    parser.add_argument("--backlog", type=int, default=None,
                        help="most runs submitted and not settled at once "
                        "(default 4 x concurrency + 8)")
    parser.add_argument("--max-queued", type=int, default=None,
                        help="the harness's --max-queued, low so that its own 503 \"queue "
                        "full\" is part of every soak (default: 2 x concurrency + 2)")
    parser.add_argument("--agent-max-ms", type=int, default=1500,
                        help="the longest the stand-in agent works on one run (ms)")
    parser.add_argument("--max-seconds", type=float, default=1800.0,
                        help="give up after this long; counted as a crash (default 1800)")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for the plan, timeline, per-run lines and logs "
                        "(default: a new temporary folder, printed)")
    parser.add_argument("--self-check", action="store_true",
                        help="break promises on purpose and show the figures catch it")
    return parser.parse_args(argv)


def queue_full_refusals(out: Path) -> int:
    """How many deliveries the harnesses refused because their queue was full (their
    logs say so once each)."""
    return sum(log.read_text(errors="replace").count(QUEUE_FULL_LINE)
               for log in sorted(out.glob("harness-*.log")))


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    runs = args.runs or (40 if args.self_check else 1000)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    conversations = args.conversations or max(1, runs // 20)
    if not 1 <= args.concurrency <= 16:
        print("soak.py: --concurrency must be 1 to 16 (the harness's range)", file=sys.stderr)
        return 2
    try:
        plan = make_plan(seed, runs, conversations, agent_max_ms=args.agent_max_ms,
                         self_check=args.self_check)
    except ValueError as exc:
        print(f"soak.py: {exc}", file=sys.stderr)
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix=f"prohost-soak-{seed}-"))
    out.mkdir(parents=True, exist_ok=True)
    plan_digest = digest(plan)
    (out / "plan.json").write_text(json.dumps({**plan, "digest": plan_digest}, indent=1))
    counts = fault_counts(plan)
    print(f"soak plan: seed {seed}, {runs} runs over {conversations} conversations, "
          f"concurrency {args.concurrency}, sha256 {plan_digest}")
    print("  faults planned: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    print(f"  output: {out}", flush=True)
    backlog = args.backlog or 4 * args.concurrency + 8
    max_queued = args.max_queued or 2 * args.concurrency + 2
    soak = Soak(plan, out, concurrency=args.concurrency, backlog=backlog,
                max_queued=max_queued, max_seconds=args.max_seconds)
    began = time.monotonic()
    figures = trio.run(soak.run)
    took = time.monotonic() - began
    report = [
        f"  took {took:.0f} s; {len(soak.harnesses)} harness starts; faults injected: "
        + ", ".join(f"{k} {v}" for k, v in sorted(soak.injected.items())),
        "  outcomes: " + ", ".join(f"{v} {k}" for k, v in soak.outcomes.most_common()),
        f"  queue full: {queue_full_refusals(out)} deliveries refused with 503 by a harness "
        f"holding --max-queued {max_queued} queued runs (each redelivered later)",
    ]
    for title, items in (("lost", figures.lost), ("run twice", figures.twice),
                         ("bad reports", figures.bad), ("processes left", figures.left),
                         ("crashes", figures.crashes)):
        if items:
            report.append(f"  {title}: " + "; ".join(items[:SHOW])
                          + (f" (and {len(items) - SHOW} more)" if len(items) > SHOW else ""))
    report.append(figures.line())
    print("\n".join(report), flush=True)
    (out / "summary.txt").write_text("\n".join(report) + "\n")
    if args.self_check:
        caught = bool(figures.twice) and bool(figures.lost)
        print("self-check: the soak " + ("caught both broken promises (run twice, lost)"
                                         if caught else "MISSED a broken promise"))
        return 0 if caught else 1
    return 0 if figures.clean else 1


if __name__ == "__main__":
    raise SystemExit(main())
