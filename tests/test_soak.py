"""The chaos soak (scripts/soak.py, issue 10) in CI: a short soak with a few of each
fault must find nothing, and the soak must catch promises broken on purpose.

Both run the real script as a subprocess: a real reference server with its fault
hooks, a real harness killed, signalled and restarted, real agent processes.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
SOAK = ROOT / "scripts" / "soak.py"
sys.path.insert(0, str(ROOT / "scripts"))

from soaklib.plan import digest, fault_counts, make_plan  # noqa: E402

#: The short soak: runs and seed (any seed must pass; this one is fixed so a
#: failure can be replayed with the same command).
SHORT_RUNS = 150
SHORT_SEED = 2026
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


async def test_a_short_soak_with_every_fault_finds_nothing(tmp_path: Path) -> None:
    code, output, figures = await soak(
        tmp_path, "--runs", str(SHORT_RUNS), "--seed", str(SHORT_SEED), "--concurrency", "4",
        "--agent-max-ms", "600")
    assert figures == (SHORT_RUNS, 0, 0, 0, 0, 0), output
    assert code == 0
    # The harness's own 503 "queue full" (it runs with a low --max-queued) happened,
    # and every run so refused was still settled exactly once (the figures above).
    refused = re.search(r"queue full: (\d+) deliveries refused", output)
    assert refused is not None and int(refused.group(1)) >= 1, output
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    injected = [json.loads(line) for line in
                (tmp_path / "out" / "timeline.jsonl").read_text().splitlines()]
    kinds = {entry["kind"] for entry in injected if entry["event"] == "fault"}
    # Every kind of fault the plan holds was really injected, at least twice each.
    assert kinds == {fault["kind"] for fault in plan["faults"]}
    assert min(fault_counts(plan).values()) >= 2
    # Every run ran and was reported exactly once: the per-run lines agree.
    runs = [json.loads(line) for line in
            (tmp_path / "out" / "runs.jsonl").read_text().splitlines()]
    assert len(runs) == SHORT_RUNS
    assert all(run["problems"] == [] and run["starts"] <= 1 for run in runs)


async def test_the_self_check_catches_a_run_started_twice_and_a_forgotten_report(
    tmp_path: Path,
) -> None:
    code, output, figures = await soak(tmp_path, "--self-check", "--seed", "5")
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
    assert {"drop", "restart", "storm", "kill", "recover_term", "drain", "stop",
            "redeliver_inflight", "redeliver_reported"} == set(fault_counts(first))
