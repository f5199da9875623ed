"""scripts/bench_e2e.py's pieces, with tiny numbers: each phase measures what it
says (through a real ``prohost server`` and ``prohost agent run``) and leaves no
process behind. No speed is asserted."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import trio

from tests.kits.process import alive
from tests.kits.scripts import load_script

bench = load_script("bench_e2e")


async def sleepers(tmp_path: Path) -> set[int]:
    """Live ``sleep 3600`` processes of a harness whose home is under ``tmp_path``
    (the RSS phase's agents: an agent inherits the harness's ``PROHOST_HOME``). Other
    tests' are not counted: with tests running in parallel, a git hook's ``sleep
    3600`` in a test beside this one may start and end at any moment."""
    found = await trio.run_process(["pgrep", "-f", "^sleep 3600$"], capture_stdout=True,
                                   check=False)
    home = f"PROHOST_HOME={tmp_path}".encode()
    ours = set()
    for pid in map(int, found.stdout.split()):
        try:
            environ = (await trio.Path(f"/proc/{pid}/environ").read_bytes()).split(b"\0")
        except OSError:  # gone already
            continue
        if any(entry.startswith(home) for entry in environ) and alive(pid):
            ours.add(pid)
    return ours


async def test_throughput_phase_completes_every_run_and_times_each_probe_ack(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        result = await bench.throughput_and_acks(tmp_path, 4, 3)
    # Every run and every probe went through the real harness and reached the server.
    assert result["states"] == {"completed": 7}
    assert result["connections"] == 1
    # Each probe's ack was seen by the relay, on the server's side of the socket.
    assert len(result["ack_samples_all"]) == 3
    assert all(seconds > 0 for seconds in result["ack_samples_all"])
    # The figures use the probes acked while the backlog ran, if any was.
    busy = result["acked_while_busy"]
    assert result["ack_samples"] == (result["ack_samples_all"][:busy] if busy
                                     else result["ack_samples_all"])
    assert result["delivery_bytes"] > 100
    assert result["runs_per_s"] > 0 and result["cpu_ms_per_run"] > 0
    assert result["cpu_ms_startup"] > 0  # read from /proc when the harness connected
    # Where the machine's CPU went over the same window, from /proc and getrusage.
    of = result["cpu_ms_per_run_of"]
    assert set(of) == {"harness", "agents", "server", "bench", "machine"}
    assert all(ms >= 0 for ms in of.values()) and of["machine"] > 0


async def test_throughput_phase_runs_the_least_harness_in_the_harness_place(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        result = await bench.throughput_and_acks(tmp_path, 4, 3, least=True)
    # floor-protocol's client took every run and probe off the real server's socket
    # through the relay (signed with the paired secret), acked it and completed it.
    assert result["states"] == {"completed": 7}
    assert result["connections"] == 1
    assert len(result["ack_samples_all"]) == 3
    assert result["runs_per_s"] > 0 and result["cpu_ms_per_run"] > 0
    # Its ledger holds every run, reported.
    with sqlite3.connect(tmp_path / "least-e2e" / "ledger.sqlite3") as book:
        states = book.execute("SELECT state, count(*) FROM runs GROUP BY state").fetchall()
    assert states == [("reported", 7)]


async def test_rss_phase_waits_for_the_full_queue_and_kills_the_busy_agents(
    tmp_path: Path,
) -> None:
    before = await sleepers(tmp_path)
    with trio.fail_after(60):
        result = await bench.rss_with_queue(tmp_path, 5)
    assert result["active"] == bench.CONCURRENCY
    assert result["queued"] == 5
    assert result["rss_kib"] >= result["idle_rss_kib"] > 0
    # The 16 `sleep 3600` agents were killed with the harness.
    assert await sleepers(tmp_path) <= before


async def test_floor_pipe_runs_every_spawn_and_post_and_counts_the_client_cpu(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        result = await bench.floor_pipe(8, tmp_path)
    # The client process ran the whole batch (it checks every echo and every answer).
    assert result["runs"] == 8
    assert result["runs_per_s"] > 0 and result["seconds"] > 0
    # Its own CPU, read with getrusage, spread over the batch; the machine's, from
    # /proc/stat over the same batch.
    assert result["cpu_ms_per_run"] > 0 and result["machine_cpu_ms_per_run"] > 0


async def test_floor_ledger_makes_each_runs_four_durable_steps_in_a_real_sqlite_file(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        result = await bench.floor_pipe(8, tmp_path, ledger=True)
    assert result["runs"] == 8 and result["cpu_ms_per_run"] > 0
    # Every run, and the uncounted first, went through all four steps: accepted with
    # its body, started, its process group, finished with the agent's output.
    with sqlite3.connect(tmp_path / "floor-ledger" / "ledger.sqlite3") as book:
        rows = book.execute("SELECT state, pgid, length(body), length(outcome) "
                            "FROM runs").fetchall()
        mode = book.execute("PRAGMA journal_mode").fetchone()
    size = bench.SPAWN_STDIN_BYTES
    assert rows == [("finished", 1, size, size)] * 9
    assert mode == ("wal",)


async def test_floor_protocol_takes_each_run_off_a_websocket_and_makes_every_step(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        result = await bench.floor_protocol(8, tmp_path)
    assert result["runs"] == 8 and result["cpu_ms_per_run"] > 0
    # Every delivery, and the uncounted first, was checked and taken from its frame
    # (the client stops on a bad signature), recorded with its body, run, posted and
    # recorded reported; the outcome holds the agent's echo of the run's text.
    with sqlite3.connect(tmp_path / "floor-protocol" / "ledger.sqlite3") as book:
        rows = book.execute("SELECT id, state, pgid, body, outcome FROM runs "
                            "ORDER BY id").fetchall()
    # (The process group is the agent's pid: it leads a session of its own.)
    assert [row[:2] for row in rows] == [(f"run_{n}", "reported") for n in range(9)]
    assert all(isinstance(row[2], int) and row[2] > 1 for row in rows)
    for run_id, _, _, body, outcome in rows:
        text = json.loads(body)["text"]
        assert len(text) == bench.SPAWN_STDIN_BYTES
        assert json.loads(outcome) == {"run_id": run_id, "ok": True, "reply": text}


async def test_latency_at_rest_times_both_halves_and_their_floors_for_each_run(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        result = await bench.latency_at_rest(tmp_path, 3)
    # Every run went through the real harness to the real server (the phase checks
    # each is completed there), and one sample of each figure was taken per run.
    assert result["samples"] == 3
    for key in ("spawned", "spawn_floor", "reported", "post_floor", "spawn_protocol_floor",
                "post_protocol_floor"):
        assert len(result[key]) == 3, key
    # The agent's first mark can only be read after its delivery was written, and a
    # spawn's or a POST's end after its start.
    assert all(seconds > 0 for seconds in result["spawned"])
    assert all(seconds > 0 for seconds in result["spawn_floor"] + result["post_floor"])
    # The completions reached the relay in this process on their way to the server.
    assert result["completion_bytes"] > 100
    # floor-protocol at rest took each run (and its own uncounted first) off its
    # socket and made every step in a real sqlite file, with the agent's reply.
    with sqlite3.connect(tmp_path / "floor-protocol-rest" / "ledger.sqlite3") as book:
        rows = book.execute("SELECT id, state, outcome FROM runs").fetchall()
    assert sorted((run_id, state) for run_id, state, _ in rows) == sorted(
        [("floor-protocol-warm", "reported")]
        + [(f"floor-protocol-{n}", "reported") for n in range(4)])
    assert {json.loads(outcome)["reply"] for _, _, outcome in rows} == {bench.REST_TEXT}


async def test_floors_and_report_have_one_ratio_per_figure(tmp_path: Path) -> None:
    figures = {
        "machine": bench.machine(),
        "settings": {"runs": 4, "probes": 3, "queued": 5, "floor_samples": 8},
        "spawn_floor": await bench.spawn_floor(8),
        "post_floor": await bench.post_floor(8, tmp_path),
        "e2e": {"runs_per_s": 10.0, "cpu_ms_per_run": 3.0, "ack_samples": [0.004, 0.006],
                "cpu_ms_per_run_of": {"harness": 3.0, "agents": 1.0, "server": 2.0,
                                      "bench": 1.0, "machine": 8.0}},
        "echo": await bench.echo_round_trips(3, 600),
        "insert": await trio.to_thread.run_sync(bench.durable_inserts, 3, 600,
                                                tmp_path / "insert.sqlite3"),
        "rss": {"rss_kib": 40 * 1024, "queued": 5},
        "floor_pipe": {"runs_per_s": 20.0, "cpu_ms_per_run": 1.0,
                       "machine_cpu_ms_per_run": 4.0},
        "floor_ledger": {"runs_per_s": 16.0, "cpu_ms_per_run": 1.5},
        "floor_protocol": {"runs_per_s": 12.5, "cpu_ms_per_run": 2.0},
        "e2e_least": {"runs_per_s": 15.0, "cpu_ms_per_run": 2.0, "ack_samples": [0.001, 0.003]},
        # Seconds: the halves at 3× and 1.5× their floors, at p50 and at p99.
        "rest": {"spawned": [0.003, 0.006], "spawn_floor": [0.001, 0.002],
                 "reported": [0.0015, 0.003], "post_floor": [0.001, 0.002],
                 "spawn_protocol_floor": [0.0025, 0.004],
                 "post_protocol_floor": [0.0015, 0.0025]},
    }
    assert figures["spawn_floor"] > 0 and figures["post_floor"] > 0
    rows = bench.ratios(figures)
    assert [row["figure"] for row in rows] == [
        "end-to-end runs/s", "end-to-end runs/s vs floor-pipe",
        "harness CPU per run vs floor-pipe", "machine CPU per run vs floor-pipe",
        "harness runs/s vs floor-ledger",
        "harness CPU per run vs floor-ledger", "harness runs/s vs floor-protocol",
        "harness CPU per run vs floor-protocol",
        "harness runs/s vs the least harness, end to end",
        "harness CPU per run vs the least harness, end to end",
        "floor-protocol CPU per run vs floor-pipe",
        "ack p50 vs the least harness's", "ack p99 vs the least harness's",
        "least harness runs/s, end to end, vs floor-pipe",
        "harness CPU per run", "ack p50", "ack p99",
        "RSS, 16 busy + 5 queued",
        "at rest, delivery → spawned p50", "at rest, delivery → spawned p99",
        "at rest, exit → completion in p50", "at rest, exit → completion in p99",
        "at rest, delivery → spawned p50 vs floor-protocol",
        "at rest, delivery → spawned p99 vs floor-protocol",
        "at rest, floor-protocol delivery → spawned p50",
        "at rest, floor-protocol delivery → spawned p99",
        "at rest, exit → completion in p50 vs floor-protocol",
        "at rest, exit → completion in p99 vs floor-protocol",
        "at rest, floor-protocol exit → completion in p50",
        "at rest, floor-protocol exit → completion in p99",
    ]
    met = {row["figure"]: row["met"] for row in rows}
    assert rows[1]["ratio"] == 10.0 / 20.0 and met["end-to-end runs/s vs floor-pipe"] is False
    assert rows[2]["ratio"] == 3.0 and met["harness CPU per run vs floor-pipe"] is False
    # The machine's CPU per run (every process), said with no target.
    assert rows[3]["ratio"] == 8.0 / 4.0 and met["machine CPU per run vs floor-pipe"] is None
    # Floor-ledger is said, with no target.
    assert [row["ratio"] for row in rows[4:6]] == pytest.approx([10.0 / 16.0, 3.0 / 1.5])
    assert [row["met"] for row in rows[4:6]] == [None, None]
    # So are floor-protocol and the least harness end to end; then what floor-protocol
    # leaves of floor-pipe's 1.5× budget (none here), and what the runs/s target asks
    # of the harness given the least harness's runs/s (0.6 / (15 / 20)).
    assert [row["ratio"] for row in rows[6:14]] == pytest.approx(
        [10.0 / 12.5, 3.0 / 2.0, 10 / 15, 3 / 2, 2.0, 6 / 3, 6 / 3, 15 / 20])
    assert {row["met"] for row in rows[6:14]} == {None}
    assert "leaves the harness 0.00 ms" in rows[10]["target"]
    assert "needs the harness at 0.80× its runs/s" in rows[13]["target"]
    assert rows[14]["ratio"] == 3.0 / bench.TARGET_CPU_MS and met["harness CPU per run"] is False
    assert met["RSS, 16 busy + 5 queued"] is True
    assert [row["ratio"] for row in rows[18:22]] == pytest.approx([3.0, 3.0, 1.5, 1.5])
    assert [row["met"] for row in rows[18:22]] == [False, False, True, True]
    # Against floor-protocol at rest: the half over it, then it over the bare floor,
    # with how much of the 2× budget it leaves; said, with no target. (With
    # two samples, p50 and p99 are both the larger.)
    assert [row["ratio"] for row in rows[22:]] == pytest.approx(
        [6 / 4, 6 / 4, 4 / 2, 4 / 2, 3 / 2.5, 3 / 2.5, 2.5 / 2, 2.5 / 2])
    assert {row["met"] for row in rows[22:]} == {None}
    assert "leaves the harness 0.00 ms" in rows[24]["target"]
    assert "leaves the harness 1.50 ms" in rows[28]["target"]


async def test_a_phase_that_failed_leaves_its_rows_out(tmp_path: Path) -> None:
    figures = {"e2e": {"runs_per_s": 10.0, "cpu_ms_per_run": 3.0, "ack_samples": []},
               "floor_pipe": {"error": "floor-pipe failed: RuntimeError: boom"},
               "rest": {"error": "latency at rest did not finish within 40 s"}}
    rows = bench.ratios(figures)
    assert [row["figure"] for row in rows] == ["harness CPU per run"]
