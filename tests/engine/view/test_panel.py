"""The status panel: its picture of each harness state, its change log, and its task.

Pictures are checked on a recording 80-column console with no colour, the width
of a default terminal: the key facts must be in them and no line may be wider,
however long the agent's activity, the conversation or the error is.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

import attrs
import pytest
import rich.live
import trio
import trio.testing

from prohost.engine.view.panel import Panel, describe_change, render, use_panel
from prohost.engine.view.snapshot import FinishedRow, RunRow, Snapshot
from prohost.engine.view.statustext import compact_duration, server_host
from prohost.invocation import command
from prohost.wire.protocol import AccountRow
from tests.kits.panel import T0, assert_fits, base, busy_snapshot, recording_console
from tests.kits.paths import ROOT

LONG = "Edit src/auth/session.py: " + "replace the token refresh with a sliding window " * 8


def picture(snapshot: Snapshot, *, now: float | None = None) -> str:
    console = recording_console()
    console.print(render(snapshot, now=now))
    return console.export_text()


def picture_here(snapshot: Snapshot) -> str:
    """As the live panel draws it, in the harness's own terminal."""
    console = recording_console()
    console.print(render(snapshot, here=True))
    return console.export_text()


# --- pictures ------------------------------------------------------------------------


def test_connected_with_runs() -> None:
    text = picture(busy_snapshot())
    first = text.splitlines()[0]
    assert first.startswith("● connected")
    for fact in ("chat.example.com", "studio-mac", "claude 1.0.30", "sonnet"):
        assert fact in first
    assert "slots 3/4 · queued 3 · heartbeat 4 s ago" in text
    rows = {line.split()[0]: line for line in text.splitlines() if line.strip()}
    # The last column is how long the agent has been quiet, not a countdown (issue 31).
    assert rows["C42"].split()[-1] == "1m00s"
    assert "running" in rows["C42"] and "3m12s" in rows["C42"]
    assert "Edit src/auth/session.py" in rows["C42"]
    assert "run_3f2a9…" in rows["C42"]
    # A run outside any conversation is named by its run id, once.
    assert "45 s" in rows["—"] and rows["—"].endswith("14m22s")
    assert rows["—"].split()[1] == "run_77aa0…" and rows["—"].count("run_77aa") == 1
    assert "reporting" in rows["C7"] and "1h05m" in rows["C7"]
    assert "recent" in rows
    assert "C40" in rows["✓"] and "3m12s" in rows["✓"] and "2 min ago" in rows["✓"]
    assert "C41" in rows["✗"] and "ModuleNotFoundError" in rows["✗"]
    assert "waiting for runs" not in text
    assert_fits(text)


def test_a_plain_agent_s_runs_take_no_empty_activity_column_in_a_wide_window() -> None:
    """An agent that says nothing of what it does (a plain command) gets no
    activity column: its rows stay as short as their facts, however wide the window."""
    runs = (RunRow(run_id="run_c35c9c9b2c5a", lane="run:run_c35c9c9b2c5a", conversation=None,
                   state="running", elapsed_s=12.0, quiet_s=3.0),
            RunRow(run_id="run_0b1c2d3e4f5a", lane="conv:C7", conversation="C7",
                   state="running", elapsed_s=45.0, quiet_s=1.0))
    console = recording_console(width=160)
    console.print(render(base(runs=runs, slots_used=2)))
    lines = console.export_text().splitlines()
    header = next(line for line in lines if line.startswith("conversation"))
    assert "activity" not in header
    rows = [line for line in lines if "running" in line]
    assert len(rows) == 2 and all(len(line.rstrip()) < 60 for line in rows), rows
    assert rows[0].split() == ["—", "run_c35c9…", "running", "12", "s", "3", "s"]
    # With an activity to show, the column is back and takes the room.
    console = recording_console(width=160)
    console.print(render(base(runs=(attrs.evolve(runs[1], activity="Edit a.py"),))))
    text = console.export_text()
    assert "activity" in text and "Edit a.py" in text
    assert max(len(line.rstrip()) for line in text.splitlines()) > 140


def test_a_finished_run_outside_any_conversation_is_named_by_its_short_id() -> None:
    finished = (FinishedRow(run_id="run_c35c9c9b2c5a", conversation=None, ok=True, error=None,
                            duration_s=2.0, finished_at=T0 - 5),)
    text = picture(base(finished=finished))
    [row] = [line for line in text.splitlines() if line.startswith("✓")]
    assert row.split()[1] == "run_c35c9…", row
    assert "run run_" not in text


def test_long_activity_conversation_and_error_are_cut_to_80_columns() -> None:
    snapshot = busy_snapshot(
        server="wss://" + "very-long-subdomain." * 6 + "example.com/v1/agent/ws",
        machine="m" * 60,
        runs=(RunRow(run_id="r" * 60, lane="conv:" + "c" * 90, conversation="c" * 90,
                     state="running", elapsed_s=400_000.0, activity=LONG,
                     quiet_s=12.0),),
        finished=(FinishedRow(run_id="run_x", conversation="x" * 70, ok=False,
                              error="Traceback:\n" + "boom " * 60, duration_s=3.0,
                              finished_at=T0 - 10),),
    )
    text = picture(snapshot)
    assert_fits(text)
    assert "…" in text
    assert "4d15h" in text  # 400 000 s
    assert "Traceback: boom" in text  # the newline is flattened, not a broken row


def test_escape_sequences_in_agent_output_do_not_reach_the_terminal() -> None:
    snapshot = busy_snapshot(runs=(
        RunRow(run_id="run_1", lane="conv:C1", conversation="C1", state="running",
               elapsed_s=1.0, activity="\x1b[2J\x1b[Hcleared [bold]not markup[/bold]\r\n"),
    ))
    text = picture(snapshot)
    assert "\x1b" not in text
    assert "[bold]not markup" in text  # shown literally, never interpreted as markup


def test_reconnecting_shows_the_countdown_and_the_last_error() -> None:
    snapshot = base(connection="reconnecting", reconnect_in_s=3.0, heartbeat_age_s=None,
                    last_error="connection refused by chat.example.com:443 " * 5)
    text = picture(snapshot)
    assert text.splitlines()[0].startswith("↻ reconnecting in 3 s")
    assert "last error: connection refused by chat.example.com:443" in text
    assert "heartbeat" not in text
    assert "waiting for runs" in text
    assert_fits(text)
    # Rendered two seconds later (as `agent status` does), the countdown has moved on.
    assert picture(snapshot, now=T0 + 2).splitlines()[0].startswith("↻ reconnecting in 1 s")


def test_draining() -> None:
    text = picture(busy_snapshot(connection="draining", queued=0))
    assert text.splitlines()[0].startswith("◐ draining")
    # Wrapped, never cut: the command it names is whole.
    joined = " ".join(line.strip() for line in text.splitlines())
    assert f"taking no new ones; `{command('agent', 'stop', '--now')}` stops them" in joined
    # Only in the harness's own terminal is Ctrl-C the way to stop them.
    here = picture_here(busy_snapshot(connection="draining", queued=0))
    assert "taking no new ones; Ctrl-C again stops them" in here
    assert_fits(here)
    assert "C42" in text
    assert_fits(text)
    assert "no runs left" in picture(base(connection="draining"))


def test_stopping() -> None:
    text = picture(busy_snapshot(connection="stopping"))
    assert text.splitlines()[0].startswith("■ stopping")
    assert_fits(text)


def test_idle() -> None:
    text = picture(base())
    assert "waiting for runs" in text
    assert "slots 0/4 · queued 0 · heartbeat 4 s ago" in text
    assert "recent" not in text
    assert_fits(text)


def test_now_ages_the_clocks() -> None:
    text = picture(busy_snapshot(), now=T0 + 60)
    assert "4m12s" in text  # elapsed 192 s + 60
    assert "2m00s" in text  # quiet for 60 s + 60
    assert "heartbeat 1m04s ago" in text
    assert "3 min ago" in text  # the ok run finished 120 s before the snapshot


def test_compact_duration_and_host() -> None:
    assert [compact_duration(s) for s in (0, 45.9, 192, 3900, 90_000)] == [
        "0 s", "45 s", "3m12s", "1h05m", "1d01h"]
    assert server_host("wss://chat.example.com/v1/agent/ws") == "chat.example.com"
    assert server_host("ws://127.0.0.1:8765/v1/agent/ws") == "127.0.0.1:8765"
    assert server_host("wss://chat.example.com:443/x") == "chat.example.com"


# --- the change log -----------------------------------------------------------------------


def test_describe_change_through_a_run_lifetime() -> None:
    start = base(connection="connecting", heartbeat_age_s=None)
    [first] = describe_change(None, start)
    assert "connecting to chat.example.com" in first and "studio-mac" in first

    connected = base()
    assert describe_change(start, connected) == ["connected to chat.example.com"]

    queued = base(queued=1)
    assert describe_change(connected, queued) == ["queued: 1"]

    row = RunRow(run_id="run_1", lane="conv:C42", conversation="C42", state="preparing",
                 elapsed_s=0.0)
    preparing = base(slots_used=1, runs=(row,))
    assert describe_change(queued, preparing) == ["run run_1 (C42) started: preparing",
                                                  "queued: 0"]

    running = base(slots_used=1, runs=(attrs.evolve(row, state="running", elapsed_s=2.0),))
    assert describe_change(preparing, running) == ["run run_1 (C42): preparing → running"]

    # Only the clocks moved: nothing to say.
    later = base(slots_used=1, heartbeat_age_s=9.0,
                 runs=(attrs.evolve(row, state="running", elapsed_s=50.0, quiet_s=3.0,
                                    activity="Read README.md"),))
    assert describe_change(running, later) == []

    done = FinishedRow(run_id="run_1", conversation="C42", ok=True, error=None,
                       duration_s=192.0, finished_at=T0)
    reporting = base(runs=(attrs.evolve(row, state="reporting"),), finished=(done,))
    assert describe_change(later, reporting) == ["✓ run run_1 (C42) finished in 3m12s"]

    reported = base(finished=(done,))
    assert describe_change(reporting, reported) == []

    failed = FinishedRow(run_id="run_2", conversation=None, ok=False,
                         error="idle for 15m\nstopped", duration_s=900.0, finished_at=T0)
    # A run that started and failed between two looks is still logged as failed.
    assert describe_change(reported, base(finished=(failed, done))) == [
        "✗ run run_2 failed after 15m00s: idle for 15m stopped"]

    draining = base(connection="draining", runs=(attrs.evolve(row, run_id="run_3"),))
    assert describe_change(reported, draining) == [
        "draining: finishing 1 run, accepting no new ones",
        "run run_3 (C42) started: preparing",
    ]
    # A run that leaves without finishing (cancelled while held) is said to be dropped.
    assert describe_change(draining, base(connection="draining")) == [
        "run run_3 (C42) dropped"]


def test_describe_change_reconnecting() -> None:
    down = base(connection="reconnecting", reconnect_in_s=4.0, last_error="refused")
    assert describe_change(base(), down) == ["reconnecting in 4 s (refused)"]
    # The countdown ticking is not news; a different error is.
    assert describe_change(down, attrs.evolve(down, reconnect_in_s=1.0)) == []
    assert describe_change(down, attrs.evolve(down, last_error="timed out")) == [
        "reconnecting in 4 s (timed out)"]
    assert describe_change(base(brain_version=None), base()) == [
        "brain: claude 1.0.30 · sonnet"]


# --- the task ---------------------------------------------------------------------------


def test_use_panel() -> None:
    assert not use_panel(recording_console(), no_panel=False)
    terminal = recording_console(force_terminal=True)
    assert use_panel(terminal, no_panel=False)
    assert not use_panel(terminal, no_panel=True)


async def test_plain_panel_logs_changes(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    current = base()

    def source() -> Snapshot:
        return current

    console = recording_console()
    with caplog.at_level(logging.INFO, logger="prohost.panel"):
        async with trio.open_nursery() as nursery:
            await nursery.start(Panel(console, source, live=False).run)
            [first] = [r.getMessage() for r in caplog.records]
            assert first.startswith("connected to chat.example.com as machine studio-mac")
            caplog.clear()
            await trio.sleep(10)
            assert caplog.records == []  # nothing changed, nothing logged
            current = base(heartbeat_age_s=14.0)
            await trio.sleep(2)
            assert caplog.records == []
            current = busy_snapshot()
            await trio.sleep(1.5)
            lines = [r.getMessage() for r in caplog.records]
            assert "run run_3f2a9c1e4b5d (C42) started: running" in lines
            assert "✗ run run_dd44ee55ff66 (C41) failed after 45 s: agent exited with " \
                   "status 1: ModuleNotFoundError: no module named 'auth'" in lines
            caplog.clear()
            current = busy_snapshot(connection="draining")
            await trio.sleep(1.5)
            assert [r.getMessage() for r in caplog.records] == [
                "draining: finishing 3 runs, accepting no new ones"]
            nursery.cancel_scope.cancel()
    # The plain mode never draws.
    assert console.export_text() == ""


async def test_a_broken_source_ends_the_panel_not_the_harness(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    calls = 0

    def source() -> Snapshot:
        nonlocal calls
        calls += 1
        if calls > 2:
            raise RuntimeError("snapshot bug")
        return base()

    for live in (False, True):
        calls = 0
        console = recording_console(force_terminal=True)
        with caplog.at_level(logging.ERROR, logger="prohost.panel"):
            with trio.fail_after(30):
                await Panel(console, source, live=live).run()  # returns instead of raising
        assert "snapshot bug" in caplog.text
        caplog.clear()


def refresh_threads() -> list[threading.Thread]:
    """rich's ``Live`` auto-refresh threads alive now (other threads — pytest's, trio's
    worker cache — do not matter here)."""
    return [thread for thread in threading.enumerate()
            if isinstance(thread, rich.live._RefreshThread)]


def test_refresh_threads_sees_rich_auto_refresh() -> None:
    """The check above would notice the thread: a Live with auto_refresh has one."""
    live = rich.live.Live(console=recording_console(), auto_refresh=True,
                          refresh_per_second=1)
    live.start()
    started = refresh_threads()
    try:
        assert len(started) == 1
    finally:
        live.stop()
        # rich's stop() only asks the thread to end; wait for it, or the next test
        # would see it still alive.
        for thread in started:
            thread.join(timeout=10)
    assert refresh_threads() == []


@pytest.mark.parametrize("terminal", [False, True])
async def test_live_panel_starts_and_stops_without_threads(
    autojump_clock: trio.testing.MockClock, terminal: bool
) -> None:
    current = base()

    def source() -> Snapshot:
        return current

    console = recording_console(force_terminal=terminal)
    stdout, stderr = sys.stdout, sys.stderr
    async with trio.open_nursery() as nursery:
        await nursery.start(Panel(console, source, live=True).run)
        assert refresh_threads() == []  # rich's auto-refresh would have started one
        current = busy_snapshot()
        await trio.sleep(3)
        assert refresh_threads() == []
        if terminal:
            assert "C42" in console.export_text(clear=False)  # refreshed by the task
        current = busy_snapshot(connection="draining")
        nursery.cancel_scope.cancel()
    assert refresh_threads() == []
    assert (sys.stdout, sys.stderr) == (stdout, stderr)  # redirection undone
    text = console.export_text()
    # The last frame stays on screen, and it is the state at the moment it stopped.
    # Drawn once the harness has finished: a drain that ended says so, with no
    # heartbeat clock or Ctrl-C hint left over (issue 31).
    last = text[text.rindex("✓ drained"):]
    assert "● connected" not in last and "◐ draining" not in last
    assert "heartbeat" not in last and "Ctrl-C" not in last
    assert "every run it took has finished" in last
    assert "C42" in last and "recent" in last
    if not terminal:  # (a terminal's frames are joined by cursor moves, which export drops)
        assert_fits(text)


async def test_log_lines_print_above_the_live_panel(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from prohost.logfile import log_handler

    console = recording_console(force_terminal=True)
    logger = logging.getLogger("prohost.test_panel")
    handler = log_handler(console)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(Panel(console, busy_snapshot, live=True).run)
            logger.warning("a line from the harness")
            await trio.sleep(1)
            nursery.cancel_scope.cancel()
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    text = console.export_text()
    assert "a line from the harness" in text
    # The panel is redrawn under the log line, and is the last thing on screen.
    assert text.rindex("● connected") > text.index("a line from the harness")


# --- the README's capture -------------------------------------------------------------------

DOCS_CAPTURE = ROOT / "docs" / "panel.txt"


def docs_capture() -> str:
    """What docs/panel.txt shows: the panel with runs, at 80 columns, as plain text."""
    lines = [line.rstrip() for line in picture(busy_snapshot()).splitlines()]
    return "\n".join(lines).rstrip() + "\n"


def test_docs_capture_is_current() -> None:
    # PROHOST_WRITE_DOCS=1 rewrites it after a deliberate change to the panel.
    if os.environ.get("PROHOST_WRITE_DOCS") == "1":
        DOCS_CAPTURE.write_text(docs_capture(), encoding="utf-8")
    assert DOCS_CAPTURE.read_text(encoding="utf-8") == docs_capture(), (
        "docs/panel.txt is out of date: "
        "PROHOST_WRITE_DOCS=1 pytest tests/engine/view/test_panel.py")


# --- accounts (docs/protocol.md §12) ------------------------------------------------------


def two_accounts(reset: float) -> tuple[AccountRow, ...]:
    return (AccountRow(name="work", state="ok", resets_at=None, used_percent=41.2),
            AccountRow(name="personal", state="limited", resets_at=int(reset),
                       used_percent=None))


@pytest.mark.protocol("§12")
def test_the_accounts_line_shows_use_and_limits() -> None:
    reset = T0 + 3600
    clock = time.strftime("%H:%M", time.localtime(reset))
    text = picture(base(accounts=two_accounts(reset)))
    assert f"accounts  work ✓ 41% · personal ⏸ until {clock}" in text.splitlines()
    assert_fits(text)
    # One implicit default account (no --account) has nothing to say.
    plain = picture(base(accounts=(AccountRow(name="default", state="ok"),)))
    assert "accounts" not in plain


@pytest.mark.protocol("§12")
def test_describe_change_says_when_an_account_is_limited_and_back() -> None:
    reset = T0 + 3600
    clock = time.strftime("%H:%M", time.localtime(reset))
    ok = (AccountRow(name="work", state="ok"), AccountRow(name="personal", state="ok"))
    limited = two_accounts(reset)
    assert describe_change(base(accounts=ok), base(accounts=limited)) == [
        f"account personal ⏸ until {clock}"]
    assert describe_change(base(accounts=limited), base(accounts=ok)) == [
        "account personal ✓"]
