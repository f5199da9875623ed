"""``prohost agent status`` reading real status files written by ``write_snapshot``.

The command is given its clock (``now``): ages are exact, never the wall clock's.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import attrs
import pytest
import trio
from rich.console import Console

from prohost.commands.status import EXIT_NOT_RUNNING, EXIT_RUNNING, EXIT_STALE, status_command
from prohost.engine.view.snapshot import STATUS_FILE, Snapshot, write_snapshot
from prohost.wire.protocol import AccountRow
from tests.kits.panel import assert_fits, busy_snapshot
from tests.kits.status import status_says


def consoles() -> tuple[Console, Console]:
    return (
        Console(file=io.StringIO(), width=80, record=True, color_system=None),
        Console(file=io.StringIO(), width=80, record=True, color_system=None),
    )


#: "Now" for every status command here (epoch s).
NOW = 1_800_000_000.0


def run_status(home: Path, *, as_json: bool = False, now: float = NOW) -> tuple[int, str, str]:
    out, err = consoles()
    code = status_command(home, as_json=as_json, console=out, error_console=err, now=now)
    return code, out.export_text(), err.export_text()


def fresh(**changes: object) -> Snapshot:
    fields: dict[str, object] = {"taken_at": NOW, "pid": os.getpid(), **changes}
    return attrs.evolve(busy_snapshot(), **fields)  # type: ignore[arg-type]


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: the pid names no process now
    return child.pid


def test_fresh_snapshot_prints_the_panel_picture(tmp_path: Path) -> None:
    write_snapshot(tmp_path, fresh())
    code, out, err = run_status(tmp_path)
    assert code == EXIT_RUNNING
    assert out.startswith("● connected · chat.example.com")
    assert "slots 3/4 · queued 3" in out
    assert "C42" in out and "ModuleNotFoundError" in out
    assert err == ""
    assert_fits(out)


def test_json(tmp_path: Path) -> None:
    snapshot = fresh(taken_at=NOW - 2.5)
    write_snapshot(tmp_path, snapshot)
    code, out, _ = run_status(tmp_path, as_json=True)
    assert code == EXIT_RUNNING
    document = json.loads(out)
    assert document["running"] is True
    assert document["stale"] is False
    assert document["age_s"] == 2.5
    assert document["pid"] == os.getpid()
    assert [run["run_id"] for run in document["runs"]] == [r.run_id for r in snapshot.runs]
    # Everything else is the snapshot itself, as the harness wrote it.
    del document["running"], document["stale"], document["age_s"]
    assert json.dumps(document, indent=2) == snapshot.to_json()


@pytest.mark.protocol("§12")
def test_accounts_in_the_picture_and_the_json(tmp_path: Path) -> None:
    reset = int(NOW) + 3600
    accounts = (AccountRow(name="work", state="warning", resets_at=reset, used_percent=80.0),
                AccountRow(name="personal", state="limited", resets_at=reset))
    write_snapshot(tmp_path, fresh(accounts=accounts))
    _, out, _ = run_status(tmp_path)
    clock = time.strftime("%H:%M", time.localtime(reset))
    assert f"accounts  work ⚠ 80% · personal ⏸ until {clock}" in out
    _, out, _ = run_status(tmp_path, as_json=True)
    assert json.loads(out)["accounts"] == [
        {"name": "work", "state": "warning", "resets_at": reset, "used_percent": 80.0},
        {"name": "personal", "state": "limited", "resets_at": reset, "used_percent": None},
    ]


def test_no_file(tmp_path: Path) -> None:
    code, out, _ = run_status(tmp_path)
    assert code == EXIT_NOT_RUNNING
    assert out.strip() == f"No prohost agent is running for {tmp_path}."
    code, out, _ = run_status(tmp_path, as_json=True)
    assert code == EXIT_NOT_RUNNING
    assert json.loads(out) == {"running": False, "age_s": None, "home": str(tmp_path)}


def test_stale_snapshot_of_a_dead_process(tmp_path: Path) -> None:
    pid = dead_pid()
    write_snapshot(tmp_path, fresh(pid=pid, taken_at=NOW - 600))
    code, out, _ = run_status(tmp_path)
    assert code == EXIT_NOT_RUNNING
    assert " ".join(out.split()) == (
        f"No prohost agent is running for {tmp_path} (the last one, pid {pid}, "
        "stopped without cleaning up 10 minutes ago).")
    code, out, _ = run_status(tmp_path, as_json=True)
    assert code == EXIT_NOT_RUNNING
    document = json.loads(out)
    assert document["running"] is False and document["pid"] == pid
    assert document["age_s"] == 600


def test_fresh_snapshot_of_a_dead_process_is_not_running(tmp_path: Path) -> None:
    # Killed a moment ago: the file is young, but nobody is there to update it.
    write_snapshot(tmp_path, fresh(pid=dead_pid()))
    code, out, _ = run_status(tmp_path)
    assert code == EXIT_NOT_RUNNING
    assert "stopped without cleaning up" in out


def test_stale_snapshot_of_a_live_process_warns_it_may_be_hung(tmp_path: Path) -> None:
    write_snapshot(tmp_path, fresh(taken_at=NOW - 95))
    code, out, _ = run_status(tmp_path)
    assert code == EXIT_STALE
    first = " ".join(out.split("\n● ")[0].split())
    assert first.startswith(f"⚠ pid {os.getpid()} has not updated {tmp_path / STATUS_FILE}")
    assert "for 1m35s (hung?)" in first
    assert "● connected" in out and "C42" in out
    # Its clocks are shown as they were, not aged by the 95 s it has been silent.
    assert "3m12s" in out
    code, out, _ = run_status(tmp_path, as_json=True)
    assert code == EXIT_STALE
    document = json.loads(out)
    assert document["running"] is True and document["stale"] is True


def test_corrupt_file(tmp_path: Path) -> None:
    (tmp_path / STATUS_FILE).write_text("{not json", encoding="utf-8")
    code, out, err = run_status(tmp_path)
    assert code == EXIT_NOT_RUNNING
    assert out == ""
    [line] = err.splitlines()
    assert line.startswith("prohost: cannot read the agent status: ")
    assert str(tmp_path / STATUS_FILE) in line

    (tmp_path / STATUS_FILE).write_text('{"pid": "x"}', encoding="utf-8")
    code, out, err = run_status(tmp_path, as_json=True)
    assert code == EXIT_NOT_RUNNING
    assert out == "" and len(err.splitlines()) == 1


async def test_status_of_a_real_running_harness_and_after_it_exits(tmp_path: Path) -> None:
    from rich.console import Console as RichConsole

    from tests.kits.harness import gated_harness

    home = tmp_path / "home"

    def status_text() -> tuple[int, str]:
        out = io.StringIO()
        code = status_command(home, as_json=False,
                              console=RichConsole(file=out, width=80, color_system=None),
                              error_console=RichConsole(file=io.StringIO()))
        return code, out.getvalue()

    with trio.fail_after(60):
        async with gated_harness(home) as (gate, running):
            run_id = await running.server.submit_run("work", conversation_id="C42")
            await gate.wait_started(run_id)
            # The harness rewrites status.json on every change, at most once a second.
            await running.harness.wait_until(lambda h: h.held[run_id].state == "running")
            await status_says(home, lambda seen: any(row.lane == "conv:C42"
                                                     for row in seen.runs))
            code, text = status_text()
            assert code == 0
            assert "connected" in text and "running" in text
            await gate.release(run_id)
            await running.server.wait_until(lambda s: s.runs[run_id].completion is not None)
            running.harness.drain()
            assert await running.wait_exit() == 0
        code, text = status_text()
    assert code == 1
    assert not (home / "status.json").exists()
