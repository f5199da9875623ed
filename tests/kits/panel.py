"""Pictures of the harness for the panel's and ``agent status``'s tests: snapshots
(one of a busy harness) at a fixed instant, and an 80-column recording console.
"""

from __future__ import annotations

import io

import attrs
from rich.console import Console

from prohost.engine.view.snapshot import FinishedRow, RunRow, Snapshot

#: The instant every snapshot here is taken at.
T0 = 1_700_000_000.0


def recording_console(width: int = 80, **kwargs: object) -> Console:
    """A console that records what is printed: 80 columns (or ``width``), no colour."""
    return Console(file=io.StringIO(), width=width, record=True, color_system=None,
                   **kwargs)  # type: ignore[arg-type]


def assert_fits(text: str, width: int = 80) -> None:
    """No line of ``text`` is wider than ``width``."""
    wide = [line for line in text.splitlines() if len(line) > width]
    assert not wide, wide


def base(**changes: object) -> Snapshot:
    """A connected harness with nothing to do, with ``changes``."""
    snapshot = Snapshot(
        taken_at=T0, pid=4242, version="0.1.0", connection="connected",
        server="wss://chat.example.com/v1/agent/ws", machine="studio-mac", brain="claude",
        brain_version="1.0.30", model="sonnet", slots=4, slots_used=0, queued=0,
        heartbeat_age_s=4.2,
    )
    return attrs.evolve(snapshot, **changes)  # type: ignore[arg-type]


def busy_snapshot(**changes: object) -> Snapshot:
    """Connected with runs: two running (one outside any conversation), one reporting,
    three queued, and a finished ok and a failed run."""
    snapshot = base(
        slots_used=3, queued=3,
        runs=(
            RunRow(run_id="run_3f2a9c1e4b5d", lane="conv:C42", conversation="C42",
                   state="running", elapsed_s=192.0,
                   activity="Edit src/auth/session.py", quiet_s=60.0, idle_limit_s=900.0),
            RunRow(run_id="run_77aa01bc9e2f", lane="run:run_77aa01bc9e2f", conversation=None,
                   state="running", elapsed_s=45.0,
                   activity="Bash: pytest -q tests/test_session.py", quiet_s=862.0,
                   idle_limit_s=900.0),
            RunRow(run_id="run_0b1c2d3e4f5a", lane="conv:C7", conversation="C7",
                   state="reporting", elapsed_s=3900.0),
        ),
        finished=(
            FinishedRow(run_id="run_aa11bb22cc33", conversation="C40", ok=True, error=None,
                        duration_s=192.0, finished_at=T0 - 120),
            FinishedRow(run_id="run_dd44ee55ff66", conversation="C41", ok=False,
                        error="agent exited with status 1: ModuleNotFoundError: no module "
                        "named 'auth'", duration_s=45.0, finished_at=T0 - 300),
        ),
    )
    return attrs.evolve(snapshot, **changes)  # type: ignore[arg-type]
