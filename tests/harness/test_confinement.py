"""Runs are confined by default (docs/protocol.md §13), through the real harness.

Everything is real: the reference server, the harness, the ledger, git, the
kernel's Landlock. The agent is ``tests/agents/prober.py``, run as the plain
brain's whole agent or as the Bash tool of the fake Claude and the fake Codex
(``FAKE_AGENT_TOOL``): it tries each write, read and commit and replies with the
errno it met, the agent's own error. ``$HOME`` is a folder of the test's, with a
``~/.ssh`` key in it; the harness's home holds its credentials and ledger.
"""

from __future__ import annotations

import logging
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from prohost.engine.sandbox import probe
from tests.kits.confinement import (
    World,
    prober,
    results,
    turn,
    world_fixture,  # noqa: F401 (a fixture)
)
from tests.kits.full_confinement import SECTION_13_CONFINED
from tests.kits.harness import (
    Gate,
    finished,
    running_harness,
    running_server,
    start_run,
)
from tests.kits.no_sandbox import without_bubblewrap, without_confinement
from tests.kits.paths import AGENTS
from tests.kits.repos import make_repo

pytestmark = SECTION_13_CONFINED

FAKE_CLAUDE = AGENTS / "fake_claude.py"
FAKE_CODEX = AGENTS / "fake_codex.py"












def agent_for(brain: str, tool: str, env: dict[str, str]) -> str:
    """The ``--exec`` line that runs ``tool`` as ``brain``'s agent (or its tool)."""
    if brain == "plain":
        return tool
    env["FAKE_AGENT_TOOL"] = tool
    script = FAKE_CLAUDE if brain == "claude" else FAKE_CODEX
    return shlex.join([sys.executable, str(script)])




@pytest.mark.parametrize("brain", ["plain", "claude", "codex"])
async def test_a_confined_run_writes_and_commits_only_in_its_own_places(
    world: World, brain: str,
) -> None:
    """Its worktree and commits there work; the original checkout, a dotfile in
    ``$HOME``, another conversation's worktree and ``$PROHOST_HOME`` are refused
    with EACCES; ``$PROHOST_HOME``'s credentials and ``~/.ssh`` cannot be read; a
    grandchild is as confined; its private ``TMPDIR`` works."""
    await make_repo(world.source)
    tool = prober(
        "write:own:$PROHOST_RUN_REPOS/app/notes.txt",
        "commit:commit:$PROHOST_RUN_REPOS/app",
        "write:tmp:$TMPDIR/scratch.txt",
        f"write:original:{world.source / 'README'}",
        f"write:original_branch:{world.source / '.git' / 'refs' / 'heads' / 'main'}",
        f"write:dotfile:{world.user / '.profile'}",
        f"write:new_in_home:{world.user / 'new.txt'}",
        f"write:other_conversation:{world.worktree('B') / 'README'}",
        f"write:prohost_home:{world.home / 'planted.txt'}",
        f"read:credentials:{world.home / 'credentials.json'}",
        f"read:ssh_key:{world.user / '.ssh' / 'id_ed25519'}",
        f"read:ssh_folder:{world.user / '.ssh'}",
        f"child:grandchild:{world.user / '.profile'}",
        f"read:source:{world.source / 'README'}",
    )
    env = dict(world.env)
    command = agent_for(brain, tool, env)
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, world.home, exec_command=command, brain=brain, env=env,
            repos=(world.source,),
        ):
            await turn(server, "B")  # B's worktree now exists
            completion = await turn(server, "A")
    assert results(completion) == {
        "own": "ok", "commit": "ok", "tmp": "ok",
        "original": "denied", "original_branch": "denied",
        "dotfile": "denied", "new_in_home": "denied",
        "other_conversation": "denied", "prohost_home": "denied",
        "credentials": "denied", "ssh_key": "denied", "ssh_folder": "denied",
        "grandchild": "denied", "source": "ok",
    }
    assert completion["confined"] is True
    assert (world.user / ".profile").read_text() == "export EDITOR=vi\n"
    assert not (world.home / "planted.txt").exists()
    # The commit is in the shared repository, on the worktree's HEAD.
    log = (world.worktree("A") / "from-the-agent.txt").read_text()
    assert log == "a change the agent commits\n"


async def test_allow_write_and_allow_read_open_exactly_what_they_name(world: World) -> None:
    """Without --repos the working directory is the run's; --allow-write opens one
    folder (not its sibling), --allow-read one file of ``~/.ssh`` (not the key)."""
    shared = world.tmp / "shared"
    sibling = world.tmp / "shared-not"
    shared.mkdir()
    sibling.mkdir()
    workdir = world.tmp / "work"
    tool = prober(
        f"write:workdir:{workdir / 'out.txt'}",
        f"write:allowed:{shared / 'out.txt'}",
        f"write:sibling:{sibling / 'out.txt'}",
        f"read:allowed_read:{world.user / '.ssh' / 'config'}",
        f"write:allowed_read_write:{world.user / '.ssh' / 'config'}",
        f"read:ssh_key:{world.user / '.ssh' / 'id_ed25519'}",
    )
    with trio.fail_after(60):
        async with running_server() as server, world.harness(
            server, tool, workdir=workdir, allow_write=(shared, world.logs),
            allow_read=(world.user / ".ssh" / "config",),
        ):
            completion = await turn(server, "A")
    assert results(completion) == {
        "workdir": "ok", "allowed": "ok", "sibling": "denied", "allowed_read": "ok",
        "allowed_read_write": "denied", "ssh_key": "denied",
    }


async def test_sandbox_off_runs_as_before(world: World) -> None:
    """``--sandbox off``: nothing is refused, and the completion says so."""
    tool = prober(f"write:dotfile:{world.user / '.profile'}",
                  f"read:credentials:{world.home / 'credentials.json'}")
    with trio.fail_after(60):
        async with running_server() as server, world.harness(server, tool, sandbox="off"):
            completion = await turn(server, "A")
    assert results(completion) == {"dotfile": "ok", "credentials": "ok"}
    assert completion["confined"] is False


@pytest.mark.parametrize("sandbox", ["auto", "off"])
async def test_a_run_cancelled_while_its_agent_ran_says_whether_it_was_confined(
    world: World, sandbox: str,
) -> None:
    """A run stopped while its agent runs (§6) reports ``confined`` (§7) as a
    finished one does: the agent was spawned, confined or not."""
    gate = Gate()
    with trio.fail_after(60):
        async with running_server() as server, trio.open_nursery() as nursery:
            await nursery.start(gate.serve)
            async with world.harness(server, gate.command, sandbox=sandbox):
                run_id = await start_run(server, gate, "hold on", conversation_id="A")
                await server.cancel_run(run_id, "stop it")
                await server.wait_until(finished(run_id))
                completion = server.run(run_id).completion
            nursery.cancel_scope.cancel()
    assert completion is not None and completion["error"] == "cancelled: stop it"
    assert completion["confined"] is (sandbox == "auto")


async def test_auto_without_support_warns_once_and_reports_unconfined(
    world: World, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """Where the system cannot confine (simulated at the probe), ``auto`` says so
    once at start and in each completion, and runs as before."""
    without_confinement(monkeypatch)
    caplog.set_level(logging.INFO, logger="prohost")
    tool = prober(f"write:dotfile:{world.user / '.profile'}")
    with trio.fail_after(60):
        async with running_server() as server, world.harness(server, tool) as running:
            first = await turn(server, "A")
            second = await turn(server, "B")
            snapshot = running.harness.snapshot()
    assert results(first) == {"dotfile": "ok"}
    assert first["confined"] is False and second["confined"] is False
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "NOT confined" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert snapshot.confinement is not None
    assert snapshot.confinement.startswith("NOT confined: ")


async def test_without_bubblewrap_landlock_alone_confines_files_and_says_it_is_not_all(
    world: World, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """Where bubblewrap cannot run (simulated at the probe), ``auto`` falls back to
    Landlock: writes and reads are still confined, but the completion says
    ``"confined": false``, and the start line and status say what is not covered."""
    without_bubblewrap(monkeypatch)
    caplog.set_level(logging.INFO, logger="prohost")
    tool = prober(f"write:dotfile:{world.user / '.profile'}",
                  f"read:ssh_key:{world.user / '.ssh' / 'id_ed25519'}")
    with trio.fail_after(60):
        async with running_server() as server, world.harness(server, tool) as running:
            completion = await turn(server, "A")
            snapshot = running.harness.snapshot()
    assert results(completion) == {"dotfile": "denied", "ssh_key": "denied"}
    assert completion["confined"] is False
    assert snapshot.confinement is not None
    assert snapshot.confinement.startswith("partly confined (Landlock ABI ")
    assert "outlive" in snapshot.confinement
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "partly confined" in r.getMessage()]
    assert len(warnings) == 1, warnings


async def test_status_says_how_runs_are_confined(world: World) -> None:
    with trio.fail_after(60):
        async with running_server() as server, world.harness(server, prober()) as running:
            snapshot = running.harness.snapshot()
    assert snapshot.confinement == f"confined ({probe().detail})"


def _cannot_prepare(policy: object, support: object, **_: object) -> None:
    raise OSError(12, "Cannot allocate memory")


def _cannot_enter(ruleset_fd: int) -> None:
    raise OSError(1, "Operation not permitted")


@pytest.mark.parametrize("breakage", ["prepare", "apply"])
async def test_a_confinement_that_cannot_be_made_fails_the_run_unstarted(
    world: World, monkeypatch: pytest.MonkeyPatch, breakage: str,
) -> None:
    """Never unconfined by accident (§13): when the rules cannot be made, or the
    spawning thread cannot enter them (both made to fail in the library's Python,
    not in the kernel), the run fails saying so, and its agent never ran."""
    from prohost.engine.run import confine
    from prohost.engine.sandbox import landlock, seccomp

    if breakage == "prepare":
        monkeypatch.setattr(confine, "prepare", _cannot_prepare)
    else:
        # A spawning thread enters Landlock's scopes only where no socket filter
        # stands in for them (a machine without one, an --allow-write of a socket).
        monkeypatch.setattr(seccomp, "program", lambda: None)
        monkeypatch.setattr(landlock, "restrict_this_thread", _cannot_enter)
    ran = world.logs / "ran.txt"
    with trio.fail_after(60):
        async with running_server() as server, world.harness(server, prober(f"write:ran:{ran}")):
            completion = await turn(server, "A")
    assert completion["ok"] is False
    reason = {"prepare": "Cannot allocate memory",
              "apply": "entering the confinement failed: [Errno 1] Operation not permitted"}
    assert completion["error"] == (
        f"the agent could not be confined, so it was not started: {reason[breakage]}")
    assert not ran.exists()
    assert "confined" not in completion  # no agent was spawned (§7)


async def test_a_run_failing_before_its_confinement_removes_its_scratch_once(
    world: World, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run whose MCP folder cannot be made (the plain brain has no MCP) fails
    before its confinement is made: its scratch folder is removed once."""
    from prohost.engine.agent.environment import scratch_folder
    from prohost.engine.run import workspace

    removed: list[Path] = []

    async def counted(run: Any, scratch: Path, bounds: Any, *, made: bool = False) -> None:
        removed.append(scratch)
        await remove(run, scratch, bounds, made=made)

    remove = workspace.remove_scratch
    monkeypatch.setattr(workspace, "remove_scratch", counted)
    ran = world.logs / "ran.txt"
    with trio.fail_after(60):
        async with running_server() as server, world.harness(server, prober(f"write:ran:{ran}")):
            run_id = await server.submit_run("probe", conversation_id="A",
                                             mcp={"url": "https://mcp.example/mcp",
                                                  "token": "t0k3n"})
            await server.wait_until(finished(run_id))
            completion = server.run(run_id).completion
    assert completion["ok"] is False
    assert completion["error"].startswith("the run's MCP server could not be prepared")
    assert not ran.exists()
    assert removed == [scratch_folder(world.home / "runs", run_id)]


@pytest.mark.skipif(probe().kind != "bwrap", reason="a namespace's own /tmp is bubblewrap's")
async def test_a_confined_runs_temporary_files_never_reach_the_disk_or_the_next_run(
    world: World,
) -> None:
    """Under bubblewrap a run's ``TMPDIR`` is its namespace's own memory: while the
    run holds a temporary file, no file anywhere in the test's world (the harness's
    home included) has its content, and the conversation's next run does not find
    it. Nothing is made on the disk for it, nor removed after it."""
    token = "a temporary file of the first run's"
    writes = f'printf %s {shlex.quote(token)} > "$TMPDIR/left.txt" && exec '
    gate = Gate()
    with trio.fail_after(60):
        async with running_server() as server, trio.open_nursery() as nursery:
            await nursery.start(gate.serve)
            async with world.harness(server, writes + gate.command):
                run_id = await start_run(server, gate, "hold on", conversation_id="A")
                holding = await trio.to_thread.run_sync(holding_token, world.tmp, token)
                await gate.release(run_id)
                await server.wait_until(finished(run_id))
                first = server.run(run_id).completion
            nursery.cancel_scope.cancel()
        async with running_server() as server, world.harness(
                server, prober("read:left:$TMPDIR/left.txt")):
            second = await turn(server, "A")
    assert first is not None and first["ok"] is True, first
    assert holding == []
    assert results(second) == {"left": "denied"}
    assert not (world.home / "runs").exists() or list((world.home / "runs").iterdir()) == []


def holding_token(root: Path, token: str) -> list[Path]:
    """The regular files under ``root`` whose content holds ``token``."""
    return [path for path in root.rglob("*")
            if path.is_file() and not path.is_symlink() and token.encode() in path.read_bytes()]
