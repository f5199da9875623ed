"""A run's ``usage`` (§7) through the whole harness, with the fake CLIs speaking the
real ones' shapes: the protocol's keys, Codex's running totals turned into each
run's own figures across a resumed session (and a restart), failed runs included,
and today's spend in the status snapshot."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from prohost.engine.repos.worktrees import lane_folder_name
from prohost.engine.view.changelines import describe_change
from tests.kits.fake_clis import CLAUDE, CODEX, Turnstile, install, turn
from tests.kits.harness import Running, finished, released, running_harness, running_server

pytestmark = pytest.mark.protocol("§7")

#: One turn of the fake Codex (1200 input of which 200 cached, 345 output), in §7 keys.
CODEX_RUN = {"input_tokens": 1000, "output_tokens": 345, "cache_read_tokens": 200,
             "turns": 1}


async def test_codex_figures_are_each_runs_own_across_a_resumed_session_and_a_restart(
    tmp_path: Path,
) -> None:
    program = install(tmp_path, CODEX)
    codex_home = tmp_path / "codex-home"  # where the fake keeps each thread's turns
    codex_home.mkdir()
    env = {**os.environ, "CODEX_HOME": str(codex_home)}
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with running_server() as server:
            async with running_harness(server, home, exec_command=str(program),
                                       env=env) as running:
                one = await turn(running, "turn 1")
                two = await turn(running, "turn 2")
            async with running_harness(server, home, exec_command=str(program),
                                       env=env) as restarted:
                three = await turn(restarted, "turn 3")
                snapshot = restarted.harness.snapshot()
    assert one["session_id"] == two["session_id"] == three["session_id"]
    # The thread's totals grew to 3 × 1200 input; each report has one turn's share.
    assert one["usage"] == two["usage"] == three["usage"] == CODEX_RUN
    assert "cost_usd" not in one["usage"]  # Codex prints no cost: none is made up
    # Today's spend was counted again from the ledger after the restart.
    [account, *_] = snapshot.spend_today
    assert (account.runs, account.input_tokens, account.output_tokens) == (3, 3000, 1035)
    assert account.cost_usd is None


def codex_env(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """The harness's environment, and where the fake keeps each thread's rollout:
    conversation C1's CODEX_HOME of the default account, the harness's own (issue
    36: each conversation's), made by its first run."""
    env = {name: value for name, value in os.environ.items() if name != "CODEX_HOME"}
    lanes = tmp_path / "home" / "cli" / "default" / "lanes"
    return env, lanes / lane_folder_name("conv:C1") / "codex"


#: What a turn whose rollout file was not read leaves to the next one (§7): both
#: turns' tokens, said so.
TWO_CODEX_TURNS = {"input_tokens": 2000, "output_tokens": 690, "cache_read_tokens": 400,
                   "turns": 1, "includes_earlier_turns": True}


async def test_a_failed_codex_turn_reports_the_tokens_its_rollout_file_counted(
    tmp_path: Path,
) -> None:
    """Issue 28 point 8: Codex prints no usage for a failed turn, but records the
    thread's totals in its session rollout file: the failed run reports its share
    from there, and the next turn is its own again (no ``includes_earlier_turns``)."""
    program = install(tmp_path, CODEX)
    env, codex_home = codex_env(tmp_path)
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=str(program), env=env,
        ) as running:
            one = await turn(running, "turn 1")
            (codex_home / "fail_turn").write_text("1\n")
            failed = await turn(running, "turn 2")
            three = await turn(running, "turn 3")
    assert failed["ok"] is False and failed["error"].startswith("stream disconnected")
    assert one["usage"] == failed["usage"] == three["usage"] == CODEX_RUN


async def test_when_the_rollout_file_does_not_say_the_next_turn_includes_the_failed_one(
    tmp_path: Path,
) -> None:
    """The failed turn's token count is not in the rollout file's tail (a big
    command output after it): the failed run has no ``usage``, and the next turn's
    figures hold both turns and say so (§7). The turn after that is its own again."""
    program = install(tmp_path, CODEX)
    env, codex_home = codex_env(tmp_path)
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=str(program), env=env,
        ) as running:
            one = await turn(running, "turn 1")
            (codex_home / "fail_turn").write_text("big\n")
            failed = await turn(running, "turn 2")
            three = await turn(running, "turn 3")
            four = await turn(running, "turn 4")
    assert one["usage"] == four["usage"] == CODEX_RUN
    assert failed["ok"] is False and "usage" not in failed
    assert three["usage"] == TWO_CODEX_TURNS


async def test_a_timed_out_codex_turn_reports_the_tokens_its_rollout_file_counted(
    tmp_path: Path,
) -> None:
    program = install(tmp_path, CODEX)
    env, codex_home = codex_env(tmp_path)
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=str(program), env=env, timeout_s=4.0,
        ) as running:
            one = await turn(running, "turn 1")
            (codex_home / "hang_turn").write_text("1\n")
            timed_out = await turn(running, "turn 2")
            three = await turn(running, "turn 3")
    assert timed_out["ok"] is False and "4-second limit" in timed_out["error"], timed_out["error"]
    assert one["usage"] == timed_out["usage"] == three["usage"] == CODEX_RUN


@asynccontextmanager
async def hanging_codex(tmp_path: Path) -> AsyncIterator[tuple[Running, Path, Turnstile]]:
    """A harness running the fake Codex, whose hung turns (``hang_turn``) say at
    the returned turnstile when they hang (``FAKE_CODEX_GATE``), and its CODEX_HOME."""
    program = install(tmp_path, CODEX)
    env, codex_home = codex_env(tmp_path)
    turnstile = Turnstile()
    async with trio.open_nursery() as nursery:
        await nursery.start(turnstile.serve)
        env["FAKE_CODEX_GATE"] = str(turnstile.port)
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=str(program), env=env,
        ) as running:
            yield running, codex_home, turnstile
        nursery.cancel_scope.cancel()


async def cancelled_turn(running: Running, turnstile: Turnstile) -> dict[str, Any]:
    """A turn of C1 cancelled by its sender once the fake Codex hangs, all its
    work (its token count, and any output after it) in the thread's rollout file.
    Cancelled any sooner, what the harness reads there would depend on how far
    the fake had got."""
    run_id = await running.server.submit_run("turn 2", conversation_id="C1")
    await turnstile.next()
    await running.server.cancel_run(run_id, "never mind")
    await running.server.wait_until(finished(run_id))
    await released(running.harness, run_id)
    return running.server.run(run_id).completion or {}


async def test_a_cancelled_codex_turn_reports_the_tokens_its_rollout_file_counted(
    tmp_path: Path,
) -> None:
    """A stopped turn (its run's exec scope cancelled) printed no usage either: it
    reports its share from the rollout file, and the next turn is its own. Before,
    the next turn reported every earlier turn of the thread, unflagged."""
    with trio.fail_after(60):
        async with hanging_codex(tmp_path) as (running, codex_home, turnstile):
            one = await turn(running, "turn 1")
            (codex_home / "hang_turn").write_text("1\n")
            cancelled = await cancelled_turn(running, turnstile)
            three = await turn(running, "turn 3")
    assert cancelled["error"] == "cancelled: never mind"
    assert one["usage"] == cancelled["usage"] == three["usage"] == CODEX_RUN


async def test_after_a_cancelled_turn_the_rollout_does_not_tell_the_next_turn_says_so(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        async with hanging_codex(tmp_path) as (running, codex_home, turnstile):
            await turn(running, "turn 1")
            (codex_home / "hang_turn").write_text("big\n")
            cancelled = await cancelled_turn(running, turnstile)
            three = await turn(running, "turn 3")
    assert cancelled["error"] == "cancelled: never mind" and "usage" not in cancelled
    assert three["usage"] == TWO_CODEX_TURNS


async def test_claude_usage_in_the_protocols_keys_also_for_a_failed_run(
    tmp_path: Path,
) -> None:
    program = install(tmp_path, CLAUDE)
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=str(program),
            env={**os.environ, "FAKE_CLAUDE_SCENARIO": "is_error"},
        ) as running:
            failed = await turn(running, "with a bad key")
            finished = running.harness.snapshot().finished
    assert failed["ok"] is False
    assert failed["usage"] == {"input_tokens": 150, "output_tokens": 75,
                               "cache_read_tokens": 1500, "cache_write_tokens": 500,
                               "cost_usd": 0, "turns": 1,
                               "model": "claude-sonnet-4-5-20250929"}
    assert finished[0].tokens == 225 and finished[0].cost_usd == 0


async def test_claude_tokens_count_every_model_the_subagents_included(
    tmp_path: Path,
) -> None:
    """Issue 28 point 7: the result's ``usage`` is the main loop's alone; the
    tokens reported are ``modelUsage`` summed over every model (the subagent's
    too), like the cost, with ``input_tokens`` leaving out cache reads and writes."""
    program = install(tmp_path, CLAUDE)
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=str(program),
            env={**os.environ, "FAKE_CLAUDE_SCENARIO": "subagent"},
        ) as running:
            done = await turn(running, "ask a subagent")
    assert done["ok"] is True
    assert done["usage"] == {"input_tokens": 1550, "output_tokens": 415,
                             "cache_read_tokens": 4500, "cache_write_tokens": 1300,
                             "cost_usd": 0.0342, "turns": 1,
                             "model": "claude-sonnet-4-5-20250929"}


async def test_the_plain_log_says_what_a_finished_run_cost_and_how_long_it_took(
    tmp_path: Path,
) -> None:
    """Issue 28 point 10: without a panel, a run's ✓ line says its tokens and cost
    as the panel's row does, and a run of under a second did not take "0 s"."""
    program = install(tmp_path, CLAUDE)
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, tmp_path / "home", exec_command=str(program),
        ) as running:
            before = running.harness.snapshot()
            await turn(running, "hello")
            after = running.harness.snapshot()
    [row] = after.finished
    assert row.duration_s is not None and row.duration_s < 10
    took = f"{round(row.duration_s * 1000)} ms" if row.duration_s < 1 \
        else f"{row.duration_s:.1f} s"
    [line] = [line for line in describe_change(before, after) if line.startswith("✓")]
    assert line == f"✓ run {row.run_id} (C1) finished in {took}: 225 tokens · $0.0342"


async def test_after_a_crash_in_a_codex_turn_the_next_turn_says_it_includes_it(
    tmp_path: Path,
) -> None:
    """Issue 37 point 4: turn 2 dies with its harness (cancelled from outside, as a
    kill -9 leaves it: ``started`` in the ledger) after its tokens were counted;
    the restart reports it "restarted", and turn 3's running totals hold turn 2's
    tokens too, which its figures must say (§7 ``includes_earlier_turns``)."""
    program = install(tmp_path, CODEX)
    env, codex_home = codex_env(tmp_path)
    home = tmp_path / "home"
    turnstile = Turnstile()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(turnstile.serve)
            env["FAKE_CODEX_GATE"] = str(turnstile.port)
            async with running_server() as server:
                async with running_harness(server, home, exec_command=str(program),
                                           env=env) as running:
                    await turn(running, "turn 1")
                    (codex_home / "hang_turn").write_text("1\n")
                    crashed = await server.submit_run("turn 2", conversation_id="C1")
                    await turnstile.next()
                async with running_harness(server, home, exec_command=str(program),
                                           env=env) as restarted:
                    await server.wait_until(finished(crashed))
                    three = await turn(restarted, "turn 3")
                    four = await turn(restarted, "turn 4")
            nursery.cancel_scope.cancel()
    assert server.run(crashed).completion["error"].startswith("the harness restarted")
    assert three["usage"] == TWO_CODEX_TURNS
    assert four["usage"] == CODEX_RUN
