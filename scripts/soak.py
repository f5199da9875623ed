#!/usr/bin/env python3
"""A chaos soak of ``prohost agent run``: exactly once under every fault at once (issue 10).

Usage: .venv/bin/python scripts/soak.py [--runs 1000] [--seed N] [--concurrency 4]
       [--conversations K] [--max-seconds S] [--out DIR] [--self-check]
       [--kinds K1,K2] [--limit-wait S] [--disk-full auto|tmpfs|hook]

A real reference server (``prohost server --faults``) and a real harness (Claude
brain with two accounts, a stand-in agent that records every start) on 127.0.0.1.
The plan, drawn from ``--seed``, submits ``--runs`` runs over ``--conversations``
conversations and injects at random: socket drops, listener restarts (same port),
completion storms (408/429 with Retry-After/500/502/503), kill -9 and restart on
the same $PROHOST_HOME, first-signal drains, second-signal stops (20-250 ms after
the first), a run cancelled by the server just before a drain, a stop or a kill -9
(it must stay cancelled and never start again), a SIGTERM while a restarted
harness recovers its ledger, redeliveries
of runs in flight and already reported, usage limits on one account or both, and a
full disk under $PROHOST_HOME (a tmpfs it fills, or the ledger's soak-only hook).
At the end it prints:

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

from soaklib import verdict
from soaklib.driver import Soak
from soaklib.plan import FAULT_RATES, digest, fault_counts, make_plan
from soaklib.pressure import small_home

#: Problems listed per figure at the end (the rest are in runs.jsonl / timeline.jsonl).
#: What a harness logs when it refuses a new run because its queue is full, because
#: every account is limited, and because its ledger could not record the run.
QUEUE_FULL_LINE = "runs are already queued"
ALL_LIMITED_LINE = "refused with 503: every account is at its usage limit"
NOT_RECORDED_LINE = "could not record run"
#: A run's ledger step that failed, as the runner and the ledger's writer log it.
STEP_FAILED_LINE = "prohost.runner: ledger: "
WRITE_FAILED_LINE = "prohost.ledger: ledger: "
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
    parser.add_argument("--kinds", default=None,
                        help="only these fault kinds, comma-separated (default: all of "
                        + ", ".join(FAULT_RATES) + ")")
    parser.add_argument("--limit-wait", type=float, default=2.0,
                        help="the harness's --limit-wait in seconds (default 2: shorter "
                        "than some both-limited spells, so some runs are reported "
                        "retryable)")
    parser.add_argument("--disk-full", choices=("auto", "tmpfs", "hook"), default="auto",
                        help="how the home's disk is filled: a tmpfs mounted on it (root), "
                        "the ledger's soak-only hook, or tmpfs where allowed (default)")
    return parser.parse_args(argv)


def queue_full_refusals(out: Path) -> int:
    """How many deliveries the harnesses refused because their queue was full (their
    logs say so once each)."""
    return sum(log.read_text(errors="replace").count(QUEUE_FULL_LINE)
               for log in sorted(out.glob("harness-*.log")))


def count_lines(out: Path, text: str) -> int:
    """How many lines of the harnesses' logs carry ``text``."""
    return sum(log.read_text(errors="replace").count(text)
               for log in sorted(out.glob("harness-*.log")))


def pressure_report(out: Path, soak: Soak) -> list[str]:
    """What the usage limits and the full disk did, counted from the witnesses."""
    runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    refusals = verdict.read_refusals(soak.refusals_path)
    limited_runs = [run for run in runs if run["run_id"] in refusals]
    failed_over = sum(1 for run in limited_runs if run.get("ok") is True)
    settled = [run for run in runs if run.get("ok") is not None]
    failed = [run for run in settled if run["ok"] is False]
    retryable = sum(1 for run in failed if run.get("retryable") is True)
    waited_out = sum(1 for run in runs if str(run.get("error") or "").startswith(
        "every account is at its usage limit"))
    return [
        # The reference server keeps a run's first completion and never offers a
        # settled run again, retryable or not: each run is done once it has one.
        f"  accounting: {len(runs)} runs = {len(settled) - len(failed)} ok + {len(failed)} "
        f"failed ({retryable} of them retryable) + {len(runs) - len(settled)} with no "
        "completion; each run's first completion is its one report",
        f"  usage limits: {soak.injected.get('limit', 0)} on one account, "
        f"{soak.injected.get('limit_both', 0)} on both; {sum(refusals.values())} attempts "
        f"of {len(limited_runs)} runs refused by a limited account (no work done, not "
        f"starts); {failed_over} of those runs then completed (on the other account or after "
        f"the reset), {len(limited_runs) - failed_over} were reported failed; "
        f"{count_lines(out, ALL_LIMITED_LINE)} deliveries refused 503 (every account "
        f"limited); {waited_out} runs reported retryable after --limit-wait",
        f"  full disk ({soak.disk_mode}): {soak.injected.get('disk_full', 0)} times; "
        f"{count_lines(out, NOT_RECORDED_LINE)} deliveries refused 503 (could not record); "
        f"{count_lines(out, STEP_FAILED_LINE) + count_lines(out, WRITE_FAILED_LINE)} "
        "failed ledger steps of runs logged",
        f"  opening burst: {'a' if soak.burst_refused else 'NO'} delivery refused 503 "
        "\"queue full\" while every agent was held",
    ]


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    runs = args.runs or (40 if args.self_check else 1000)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    conversations = args.conversations or max(1, runs // 20)
    if not 1 <= args.concurrency <= 16:
        print("soak.py: --concurrency must be 1 to 16 (the harness's range)", file=sys.stderr)
        return 2
    try:
        kinds = tuple(args.kinds.split(",")) if args.kinds else None
        plan = make_plan(seed, runs, conversations, agent_max_ms=args.agent_max_ms,
                         self_check=args.self_check, kinds=kinds)
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
    began = time.monotonic()
    try:
        # The home's filesystem is unmounted on the way out, whatever happens.
        # A plan without a full disk needs no filesystem of its own (nor root).
        fills = any(fault["kind"] == "disk_full" for fault in plan["faults"])
        with small_home(out / "home", args.disk_full if fills else "hook",
                        out / "home-kept") as disk_mode:
            soak = Soak(plan, out, concurrency=args.concurrency, backlog=backlog,
                        max_queued=max_queued, max_seconds=args.max_seconds,
                        limit_wait_s=args.limit_wait, disk_mode=disk_mode)
            figures = trio.run(soak.run)
    except RuntimeError as exc:
        print(f"soak.py: {exc}", file=sys.stderr)
        return 2
    took = time.monotonic() - began
    report = [
        f"  took {took:.0f} s; {len(soak.harnesses)} harness starts; faults injected: "
        + ", ".join(f"{k} {v}" for k, v in sorted(soak.injected.items())),
        "  outcomes: " + ", ".join(f"{v} {k}" for k, v in soak.outcomes.most_common()),
        f"  queue full: {queue_full_refusals(out)} deliveries refused with 503 by a harness "
        f"holding --max-queued {max_queued} queued runs (each redelivered later)",
        *pressure_report(out, soak),
        # Issue 37: a cancel the harness held is final through drains, stops, kills.
        f"  cancels: {len(soak.cancelled)} held by the harness before a drain, stop or "
        f"kill -9; {sum(r in figures.twice for r in soak.cancelled)} started again, "
        f"{sum(r in figures.bad for r in soak.cancelled)} not reported cancelled",
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
