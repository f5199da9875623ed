"""The soak's plan: everything random about a soak, drawn once from ``--seed``.

The plan fixes the runs (ids, conversations, how long the stand-in agent sleeps
for each) and the faults (which kind, after which submitted run, with which
parameters, and which runs are redelivered). What the machine makes of it
(timing, which run happens to be in flight) is not in the plan; the soak's
timeline records that. The plan is canonical JSON, and its sha256 is printed so
two soaks can be shown to have run the same plan.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

#: Every fault kind the soak injects, and how many of each per 1,000 runs (count).
FAULT_RATES: dict[str, int] = {
    "drop": 12,  # abort the harness's socket (TCP reset)
    "restart": 6,  # the server stops listening for a while, then listens on the same port
    "storm": 12,  # the next completion POSTs answer 408/429/500/502/503
    "kill": 6,  # kill -9 the harness, start it again on the same $PROHOST_HOME
    "recover_term": 5,  # kill -9, restart, SIGTERM while it recovers its ledger
    "drain": 4,  # first signal: drain, exit 0; then start again
    "stop": 4,  # first signal, second 20-250 ms later: exit 130; then start again
    "redeliver_inflight": 25,  # send an acked, unreported run again
    "redeliver_reported": 25,  # send a reported run again
    "limit": 10,  # one account's CLI answers "limited" until a reset 1-6 s away
    "limit_both": 5,  # both accounts limited at once (resets 1-5 s away, staggered)
    "disk_full": 8,  # the harness's home (its ledger) is full for 0.5-4 s, then freed
    # The server cancels a running run and, once the harness holds the cancel, it is
    # drained, stopped (a second signal 20-250 ms later) or killed -9, then started
    # again: the run stays cancelled (not retryable) and never starts again (§6).
    "cancel_drain": 4,
    "cancel_stop": 4,
    "cancel_kill": 4,
}
#: The accounts the harness runs with (``--account NAME=DIR``); limits hit them.
ACCOUNTS = ("work", "personal")
#: At least this many of each fault kind, however few the runs ("a few of each").
MIN_PER_KIND = 2
#: Storm answers: the statuses a harness must retry (docs/protocol.md §7).
STORM_STATUSES = (408, 429, 500, 502, 503)
#: Runs with no conversation (their lane is ``run:<id>``), as a fraction.
NO_CONVERSATION = 0.1


def agent_sleep_ms(rng: random.Random, max_ms: int) -> int:
    """How long the stand-in agent works on one run (ms): mostly short, some long,
    so that every fault finds runs queued, running and reporting."""
    draw = rng.random()
    if draw < 0.7:
        return rng.randrange(0, max(1, max_ms // 10))
    if draw < 0.95:
        return rng.randrange(max_ms // 10, max(max_ms // 10 + 1, max_ms // 3))
    return rng.randrange(max_ms // 3, max_ms + 1)


def _fault(rng: random.Random, kind: str) -> dict[str, Any]:
    if kind == "restart":
        return {"kind": kind, "down_s": round(rng.uniform(0.2, 1.5), 2)}
    if kind == "storm":
        status = rng.choice(STORM_STATUSES)
        # Retry-After 0/1 keeps storms short; 408/500/502 use the harness's own backoff.
        retry_after = rng.choice((0, 0, 1)) if status in (429, 503) else None
        return {"kind": kind, "status": status, "count": rng.randint(1, 3),
                "retry_after": retry_after}
    if kind == "recover_term":
        # The SIGTERM lands 0-15 ms after the restarted harness's first line; one in
        # two is followed by a second signal 20-250 ms later.
        second = rng.randint(20, 250) if rng.random() < 0.5 else None
        return {"kind": kind, "delay_ms": rng.randint(0, 15), "second_ms": second}
    if kind in ("stop", "cancel_stop"):
        return {"kind": kind, "gap_ms": rng.randint(20, 250)}
    if kind == "limit":
        return {"kind": kind, "account": rng.choice(ACCOUNTS),
                "hold_s": round(rng.uniform(1.0, 6.0), 2)}
    if kind == "limit_both":
        # The second account's reset comes 0-2 s after the first's.
        return {"kind": kind, "hold_s": round(rng.uniform(1.0, 5.0), 2),
                "stagger_s": round(rng.uniform(0.0, 2.0), 2)}
    if kind == "disk_full":
        return {"kind": kind, "hold_s": round(rng.uniform(0.5, 4.0), 2)}
    if kind.startswith("redeliver_"):
        return {"kind": "redeliver", "target": kind.removeprefix("redeliver_"),
                "pick": round(rng.random(), 6)}
    return {"kind": kind}


def make_plan(
    seed: int,
    runs: int,
    conversations: int,
    *,
    agent_max_ms: int = 1500,
    self_check: bool = False,
    kinds: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """The whole plan for one soak; the same arguments always give the same plan.
    ``kinds`` keeps only those fault kinds (default: every kind of FAULT_RATES)."""
    unknown = sorted(set(kinds or ()) - set(FAULT_RATES))
    if unknown:
        raise ValueError(f"unknown fault kind(s) {', '.join(unknown)}; "
                         f"the kinds are {', '.join(FAULT_RATES)}")
    if runs < 10:
        raise ValueError("--runs must be at least 10 (faults need runs to land on)")
    if conversations < 1:
        raise ValueError("--conversations must be at least 1")
    rng = random.Random(seed)
    run_list = []
    for index in range(runs):
        conversation = (
            None if rng.random() < NO_CONVERSATION else f"soak-c{rng.randrange(conversations)}"
        )
        run_list.append({
            "run_id": f"soak{seed}-{index:05d}",
            "conversation_id": conversation,
            "sleep_ms": agent_sleep_ms(rng, agent_max_ms),
        })
    faults: list[dict[str, Any]] = []
    for kind, rate in FAULT_RATES.items():
        if kinds is not None and kind not in kinds:
            continue
        for _ in range(max(MIN_PER_KIND, round(rate * runs / 1000))):
            # Not in the first few runs: there must be something to break.
            fault = _fault(rng, kind)
            fault["at_run"] = rng.randrange(5, runs)
            faults.append(fault)
    twice: list[str] = []
    if self_check:
        # Break two promises on purpose: the agent starts the work of one run in
        # four twice (drains report some runs "not started", which never start),
        # and the server drops one valid completion after answering it 200, early
        # enough that completions still follow.
        twice = sorted(r["run_id"] for r in run_list[::4])
        faults.append({"kind": "forget", "at_run": rng.randrange(2, runs // 3)})
    faults.sort(key=lambda fault: fault["at_run"])  # stable: same-run faults keep their order
    return {
        "version": 1,
        "seed": seed,
        "runs": run_list,
        "conversations": conversations,
        "agent_max_ms": agent_max_ms,
        "self_check": self_check,
        "twice": twice,
        "faults": faults,
        **({} if kinds is None else {"kinds": sorted(kinds)}),
    }


def digest(plan: dict[str, Any]) -> str:
    """The sha256 of the plan's canonical JSON (hex)."""
    return hashlib.sha256(canonical(plan).encode()).hexdigest()


def canonical(value: Any) -> str:
    """One JSON text per value: sorted keys, no spaces."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fault_counts(plan: dict[str, Any]) -> dict[str, int]:
    """How many faults of each kind the plan holds (redeliveries by target)."""
    counts: dict[str, int] = {}
    for fault in plan["faults"]:
        name = fault["kind"]
        if name == "redeliver":
            name = f"redeliver_{fault['target']}"
        counts[name] = counts.get(name, 0) + 1
    return counts


def expected_reply(run_id: str) -> str:
    """The reply the stand-in agent prints for ``run_id`` (so a crossed reply shows)."""
    return f"soak reply {run_id} {hashlib.sha256(run_id.encode()).hexdigest()[:12]}"
