"""The chaos soak (scripts/soak.py, issues 10 and 16) in CI.

Every soak runs the real script as a subprocess: a real reference server with its
fault hooks, a real harness (killed, signalled and restarted in the long one), real
agent processes, a real ledger file.

- In the default run: a fast soak (usage limits on one account and on both, storms,
  redeliveries; no process restarts, no full disk), the plan, and the ledger's
  soak-only disk hook. What they assert holds whatever the timing: the five figures
  are promises, and the one refusal the summary must show comes from the opening
  burst, which holds every agent until the harness has refused a delivery "queue full".
- Marked ``slow`` (``scripts/test -m slow``, a separate CI step): a 150-run soak with
  every fault kind, the full disk included; and the self-check (the soak must catch
  promises broken on purpose), moved there to keep the default run under CI's
  5-minute budget.
"""

from __future__ import annotations

import json
import re
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from prohost.engine.ledger import Ledger, LedgerError, schema
from tests.kits.paths import ROOT, SCRIPTS

SOAK = SCRIPTS / "soak.py"
sys.path.insert(0, str(SCRIPTS))

from soaklib.faulty_ledger import faulty_connection  # noqa: E402
from soaklib.plan import FAULT_RATES, digest, fault_counts, make_plan  # noqa: E402

#: The long soak: runs and seed (any seed must pass; this one is fixed so a
#: failure can be replayed with the same command).
SHORT_RUNS = 150
SHORT_SEED = 2026
#: The fast soak: no kill, restart or drain (a harness start costs a second or more).
FAST_RUNS = 30
FAST_KINDS = "limit,limit_both,storm,drop,redeliver_inflight,redeliver_reported"
#: The soak bounds itself; past this the script counts a crash (seconds). Generous,
#: because the machine running the suite may be loaded: this is not a speed test.
MAX_SECONDS = 300
FIGURES = re.compile(
    r"^soak: (\d+) runs, (\d+) lost, (\d+) run twice, (\d+) bad reports, "
    r"(\d+) processes left, (\d+) crashes$", re.MULTILINE)


async def soak(tmp_path: Path, *args: str) -> tuple[int, str, tuple[int, ...]]:
    """Run scripts/soak.py; its exit status, its output, and the figures it printed."""
    result = await trio.run_process(
        [sys.executable, str(SOAK), "--out", str(tmp_path / "out"),
         "--max-seconds", str(MAX_SECONDS), *args],
        capture_stdout=True, stderr=None, check=False, cwd=ROOT)
    output = result.stdout.decode()
    print(output)  # pytest shows it when the test fails
    found = FIGURES.findall(output)
    assert len(found) == 1, f"no figures line in the soak's output:\n{output}"
    return result.returncode, output, tuple(int(n) for n in found[0])


def outputs(tmp_path: Path) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """The plan, the timeline and the per-run lines the soak left."""
    out = tmp_path / "out"
    plan = json.loads((out / "plan.json").read_text())
    timeline = [json.loads(line) for line in (out / "timeline.jsonl").read_text().splitlines()]
    runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    return plan, timeline, runs


def check_clean(tmp_path: Path, output: str, runs_planned: int) -> None:
    """What every clean soak shows, beyond its five figures."""
    plan, timeline, runs = outputs(tmp_path)
    # The harness's own 503 "queue full" happened (the opening burst guarantees it),
    # and every run so refused was still settled exactly once (the figures).
    refused = re.search(r"queue full: (\d+) deliveries refused", output)
    assert refused is not None and int(refused.group(1)) >= 1, output
    assert 'opening burst: a delivery refused 503 "queue full"' in output
    # Every kind of fault the plan holds was really injected, at least twice each.
    kinds = {entry["kind"] for entry in timeline if entry["event"] == "fault"}
    assert kinds == {fault["kind"] for fault in plan["faults"]}
    assert min(fault_counts(plan).values()) >= 2
    # Every run was reported exactly once and its work started at most once; a run
    # an account refused at its limit (no work done) started at most once after.
    assert len(runs) == runs_planned
    assert all(run["problems"] == [] and run["starts"] <= 1 for run in runs)
    assert all(run["state"] in ("completed", "failed") for run in runs)
    # A failure is retryable exactly when it is the harness's to say "try again":
    # not started (drains), restarted, stopped, every account limited.
    for run in runs:
        if run["ok"] is False and "usage limit" in run["error"]:
            assert run["retryable"] is True, run


@pytest.mark.protocol("§3", "§7", "§12")
async def test_a_fast_soak_with_usage_limits_finds_nothing(tmp_path: Path) -> None:
    code, output, figures = await soak(
        tmp_path, "--runs", str(FAST_RUNS), "--seed", "1616", "--concurrency", "2",
        "--agent-max-ms", "300", "--kinds", FAST_KINDS)
    assert figures == (FAST_RUNS, 0, 0, 0, 0, 0), output
    assert code == 0
    check_clean(tmp_path, output, FAST_RUNS)
    _, timeline, _ = outputs(tmp_path)
    # Both accounts were limited, each with a reset time.
    limited = {entry["account"] for entry in timeline if entry["event"] == "limit_set"}
    assert limited == {"work", "personal"}
    assert "accounting: 30 runs = " in output and " + 0 with no completion" in output


@pytest.mark.protocol("§3", "§7", "§9", "§12")
@pytest.mark.slow
async def test_a_short_soak_with_every_fault_finds_nothing(tmp_path: Path) -> None:
    code, output, figures = await soak(
        tmp_path, "--runs", str(SHORT_RUNS), "--seed", str(SHORT_SEED), "--concurrency", "4",
        "--agent-max-ms", "600")
    assert figures == (SHORT_RUNS, 0, 0, 0, 0, 0), output
    assert code == 0
    check_clean(tmp_path, output, SHORT_RUNS)
    _, timeline, _ = outputs(tmp_path)
    filled = [entry for entry in timeline if entry["event"] == "disk_filled"]
    freed = [entry for entry in timeline if entry["event"] == "disk_freed"]
    assert len(filled) >= 2 and len(freed) >= len(filled)
    # A tmpfs mounted for the soak is gone again.
    assert not (tmp_path / "out" / "home").is_mount()


@pytest.mark.slow  # ~10 s: the default run keeps under CI's 5-minute budget
async def test_the_self_check_catches_a_run_started_twice_and_a_forgotten_report(
    tmp_path: Path,
) -> None:
    code, output, figures = await soak(tmp_path, "--self-check", "--seed", "5",
                                       "--kinds", "storm,limit", "--agent-max-ms", "300")
    _, lost, twice, _, _, _ = figures
    assert twice >= 1, output  # the agent started some runs' work twice
    assert lost >= 1, output  # the server dropped a completion it answered 200
    assert "caught both broken promises" in output
    assert code == 0
    runs = [json.loads(line) for line in
            (tmp_path / "out" / "runs.jsonl").read_text().splitlines()]
    # The lost run is the one whose completion the server forgot.
    assert any(run.get("forgotten") and run["problems"][0].startswith("lost") for run in runs)


def test_the_plan_is_fixed_by_its_seed() -> None:
    first = make_plan(11, 200, 10)
    assert digest(make_plan(11, 200, 10)) == digest(first)
    assert digest(make_plan(12, 200, 10)) != digest(first)
    # Faults fire in run order, on runs that exist, and every kind is there.
    at = [fault["at_run"] for fault in first["faults"]]
    assert at == sorted(at) and at[0] > 0 and at[-1] < 200
    assert set(fault_counts(first)) == {
        "drop", "restart", "storm", "kill", "recover_term", "drain", "stop",
        "redeliver_inflight", "redeliver_reported", "limit", "limit_both", "disk_full",
        "cancel_drain", "cancel_stop", "cancel_kill"}
    assert set(FAULT_RATES) | {"redeliver_inflight", "redeliver_reported"} >= set(
        fault_counts(first))
    # A soak of some kinds only is a plan of its own, fixed by its seed as well.
    some = make_plan(11, 200, 10, kinds=("limit", "disk_full"))
    assert set(fault_counts(some)) == {"limit", "disk_full"}
    assert digest(some) == digest(make_plan(11, 200, 10, kinds=("disk_full", "limit")))
    assert digest(some) != digest(first)
    with pytest.raises(ValueError, match="unknown fault kind"):
        make_plan(11, 200, 10, kinds=("flood",))


def test_the_ledgers_soak_hook_fails_commits_only_while_its_file_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    control = tmp_path / "disk-full"
    control.write_text("full\n")
    # Without the faulty connection, the control file means nothing.
    with Ledger.open(tmp_path / "plain.sqlite3") as ledger:
        ledger.admit("r0", "lane", "{}", time.time())
    monkeypatch.setattr(schema, "connection_class", faulty_connection(full_while=str(control)))
    control.unlink()
    with Ledger.open(tmp_path / "ledger.sqlite3") as ledger:
        ledger.admit("r1", "lane", "{}", time.time())
        control.write_text("full\n")
        with pytest.raises(LedgerError, match="database or disk is full"):
            ledger.admit("r2", "lane", "{}", time.time())
        control.unlink()
        # Freed: the ledger works again, and holds what was committed, not the rest.
        ledger.admit("r3", "lane", "{}", time.time())
    conn = sqlite3.connect(tmp_path / "ledger.sqlite3")
    try:
        held = [row[0] for row in conn.execute("SELECT run_id FROM runs ORDER BY seq")]
    finally:
        conn.close()
    assert held == ["r1", "r3"]
