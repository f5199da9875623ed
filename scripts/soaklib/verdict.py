"""The soak's figures, from three witnesses that do not trust the harness:

- the server's audit (``GET /v1/faults/runs``): acks, every completion POST and its body;
- the stand-in agent's append-only starts file: how often each run's work started;
- the processes: /proc after the end, every harness's exit status and log.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import attrs

from soaklib.plan import canonical, expected_reply

#: The ledger file under $PROHOST_HOME (prohost/commands/agent.py's LEDGER_FILE).
LEDGER_FILE = "ledger.sqlite3"


@attrs.define
class Figures:
    runs: int
    lost: list[str] = attrs.field(factory=list)
    twice: list[str] = attrs.field(factory=list)
    bad: list[str] = attrs.field(factory=list)
    left: list[str] = attrs.field(factory=list)
    crashes: list[str] = attrs.field(factory=list)

    @property
    def clean(self) -> bool:
        return not (self.lost or self.twice or self.bad or self.left or self.crashes)

    def line(self) -> str:
        return (
            f"soak: {self.runs} runs, {len(self.lost)} lost, {len(self.twice)} run twice, "
            f"{len(self.bad)} bad reports, {len(self.left)} processes left, "
            f"{len(self.crashes)} crashes"
        )


def read_starts(path: Path) -> Counter[str]:
    """How many times the agent started each run id (one line per start)."""
    counts: Counter[str] = Counter()
    if path.exists():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.strip():
                counts[line.split()[0]] += 1
    return counts


def unreported_rows(home: Path) -> list[tuple[str, str]]:
    """(run_id, state) of every ledger row not ``reported``, read-only (the harness
    has exited; the soak must not change what the next start finds)."""
    path = home / LEDGER_FILE
    if not path.exists():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    try:
        rows = conn.execute(
            "SELECT run_id, state FROM runs WHERE state != 'reported' ORDER BY seq"
        ).fetchall()
    finally:
        conn.close()
    return [(str(run_id), str(state)) for run_id, state in rows]


def judge_run(plan_run: dict[str, Any], audit: dict[str, Any] | None, starts: int,
              cancelled_at: int | None = None) -> dict[str, Any]:
    """One line of runs.jsonl: what happened to one run, and which promise it broke.
    ``cancelled_at``: the soak cancelled it once started, the harness held the
    cancel, and the agent had started it this many times then (§6: a held cancel is
    final, reported cancelled and not retryable, and the run never starts again)."""
    run_id = plan_run["run_id"]
    line: dict[str, Any] = {"run_id": run_id, "conversation_id": plan_run["conversation_id"],
                            "sleep_ms": plan_run["sleep_ms"], "starts": starts}
    problems = []
    if audit is None:
        line["state"] = "never submitted"
        problems.append("lost: never reached the server")
        line["problems"] = problems
        return line
    posts = audit["posts"]
    bodies = {canonical(post["body"]) for post in posts if post["body"] is not None}
    completion = audit["completion"]
    line.update(
        state=audit["state"], acked=audit["acked"], ack_statuses=audit["ack_statuses"],
        deliveries=audit["deliveries"], posts=[post["status"] for post in posts],
        distinct_bodies=len(bodies),
        forgotten=sum(1 for post in posts if post.get("forgotten")),
        ok=None if completion is None else completion.get("ok"),
        error=None if completion is None else completion.get("error"),
        retryable=None if completion is None else completion.get("retryable"),
    )
    if completion is None:
        problems.append("lost: acked, never settled" if audit["acked"]
                        else "lost: never acked 200, never settled")
    if starts > 1:
        problems.append(f"run twice: the agent started it {starts} times")
    if len(bodies) > 1:
        problems.append(f"bad report: {len(bodies)} different completion bodies")
    if cancelled_at is not None:
        line["cancelled_at_starts"] = cancelled_at
        if starts > cancelled_at:
            problems.append(f"run twice: cancelled, then started again ({starts} starts)")
        if completion is not None and completion.get("ok") is not True and (
            completion.get("retryable") is not False
            or not str(completion.get("error", "")).startswith("cancelled: ")
        ):
            problems.append(f"bad report: cancelled, reported {completion.get('error')!r} "
                            f"retryable={completion.get('retryable')!r} (a retrying "
                            "server would run it again)")
    for post in posts:
        body = post["body"]
        if isinstance(body, dict) and body.get("ok") is True and (
            body.get("reply") or ""
        ).strip() != expected_reply(run_id):
            problems.append(f"bad report: reply {body.get('reply')!r} is not this run's")
            break
    line["problems"] = problems
    return line


def read_refusals(path: Path) -> Counter[str]:
    """How many attempts of each run id a limited account refused (no work done)."""
    return read_starts(path)


def tally(plan: dict[str, Any], lines: list[dict[str, Any]]) -> Figures:
    figures = Figures(runs=len(plan["runs"]))
    for line in lines:
        for problem in line["problems"]:
            kind = problem.split(":", 1)[0]
            target = {"lost": figures.lost, "run twice": figures.twice,
                      "bad report": figures.bad}[kind]
            if line["run_id"] not in target:
                target.append(line["run_id"])
    return figures


def outcome_summary(lines: list[dict[str, Any]]) -> Counter[str]:
    """How runs ended, by the error they were reported with ("ok" for success)."""
    summary: Counter[str] = Counter()
    for line in lines:
        if line.get("ok") is True:
            summary["ok"] += 1
        elif line.get("error") is not None:
            summary[str(line["error"])[:80]] += 1
        else:
            summary[f"({line.get('state')})"] += 1
    return summary
