"""Run ids are taken by any unique prefix, with or without ``run_`` (issue 40, point
4), as git takes a commit's first digits: ``prohost agent runs --show`` run as a
real process on a home whose real sqlite ledger holds runs whose ids share their
first characters. Not unique: every match is listed and the exit status is 2.
(``agent cancel`` takes its id through the same lookup: tests/commands/test_agent_cancel.py.)
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

from prohost.engine.ledger import Ledger
from prohost.wire.runs import parse_body
from tests.kits.program import program_env, run_cli
from tests.kits.serverproc import quoted_commands, without_prohost_on_path

NOW = 1_700_000_000.0
IDS = ("run_673c1a2b3c4d", "run_673c9f8e7d6c", "run_a1b2c3d4e5f6")


def ledger_with_runs(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    with Ledger.open(home / "ledger.sqlite3") as ledger:
        for index, run_id in enumerate(IDS):
            body = json.dumps({"run_id": run_id, "completion_path": f"/runs/{run_id}/done",
                               "text": "hello", "conversation_id": f"C{index}"})
            ledger.admit(run_id, parse_body(body).lane, body, NOW + index)


def test_a_unique_prefix_names_its_run_with_or_without_run_(tmp_path: Path) -> None:
    ledger_with_runs(tmp_path)
    for typed in ("run_673c1", "673c1", "run_a", "a1b2", IDS[1]):
        shown = run_cli(tmp_path, "agent", "runs", "--show", typed, "--json")
        assert shown.returncode == 0, (typed, shown.stderr)
        wanted = next(run_id for run_id in IDS if run_id.startswith(typed)
                      or run_id.startswith("run_" + typed))
        assert json.loads(shown.stdout)["run_id"] == wanted


def test_a_prefix_of_several_runs_lists_them_and_exits_2(tmp_path: Path) -> None:
    ledger_with_runs(tmp_path)
    for typed in ("run_673c", "673"):
        shown = run_cli(tmp_path, "agent", "runs", "--show", typed)
        assert shown.returncode == 2, shown
        assert shown.stdout == ""
        assert f"2 runs start with {typed!r}" in shown.stderr
        listed = [line for line in shown.stderr.splitlines() if line.startswith("  ")]
        # Newest first, each on the line `agent runs` prints for it.
        assert [line.split()[3] for line in listed] == [IDS[1], IDS[0]]


def test_no_match_says_so_and_exits_1(tmp_path: Path) -> None:
    ledger_with_runs(tmp_path)
    for typed in ("run_673d", "b", "%", "_"):
        shown = run_cli(tmp_path, "agent", "runs", "--show", typed)
        assert shown.returncode == 1, (typed, shown)
        assert f"No run {typed!r}" in shown.stderr and "agent runs` lists them" in shown.stderr


def test_the_command_that_lists_the_runs_runs_as_printed(tmp_path: Path) -> None:
    # "No run …" and "nothing to cancel" name `agent runs`; without prohost on PATH
    # (a virtual environment not activated) it must run as printed, and list them.
    ledger_with_runs(tmp_path)
    env = without_prohost_on_path(program_env(tmp_path))
    for args in (("agent", "runs", "--show", "b"), ("agent", "cancel", "673c1")):
        said = run_cli(tmp_path, *args, env=env)
        assert said.returncode == 1, said
        [listing] = quoted_commands(said.stderr)
        listed = subprocess.run(shlex.split(listing), env=env, capture_output=True, text=True,
                                timeout=60, check=False)
        assert listed.returncode == 0, listed.stderr
        assert all(run_id in listed.stdout for run_id in IDS)
