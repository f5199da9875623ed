"""A hostile agent against the confinement (docs/protocol.md §13), through the real
harness and reference server: the person's sockets and processes, the modes and
times of what is not the run's, what a run leaves running, and the person's
terminals. ``tests/agents/attacker.py`` tries each; every test judges by what
happened outside the run (listeners, processes, ``os.stat``, ``/proc``, a
terminal's other end), never by what the agent says.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.kits.confinement import (
    World,
    accepted_any,
    listening,
    world_fixture,  # noqa: F401 (a fixture)
)
from tests.kits.full_confinement import SECTION_13_CONFINED
from tests.kits.harness import finished, running_server
from tests.kits.paths import AGENTS
from tests.kits.repos import make_repo

pytestmark = SECTION_13_CONFINED

ATTACKER = AGENTS / "attacker.py"


def attacker(*actions: str) -> str:
    return shlex.join([sys.executable, str(ATTACKER), *actions])


async def attacked(server: Any, conversation: str = "A") -> tuple[str, dict[str, Any]]:
    """Submit a run, and return its id and completion once it is posted."""
    run_id = await server.submit_run("attack", conversation_id=conversation)
    await server.wait_until(finished(run_id))
    completion: dict[str, Any] = server.run(run_id).completion
    assert completion is not None and completion["ok"] is True, completion
    return run_id, completion


@pytest.fixture
def outside() -> Iterator[Path]:
    """A folder of the person's in ``/tmp`` (where tmux, ssh-agent and X keep their
    sockets), apart from the test's own ``tmp_path``."""
    folder = Path(tempfile.mkdtemp(prefix="prohost-person-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def runtime_dir() -> Iterator[Path]:
    """The person's ``$XDG_RUNTIME_DIR``: in ``/run`` where this test may write there."""
    base = "/run" if os.access("/run", os.W_OK) else "/tmp"
    folder = Path(tempfile.mkdtemp(prefix="prohost-xdg-", dir=base))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def person() -> Iterator[subprocess.Popen[bytes]]:
    """A process of the person's, outside every run."""
    process = subprocess.Popen(["sleep", "600"])
    yield process
    process.kill()
    process.wait()




async def test_the_persons_sockets_and_processes_are_out_of_reach(
    world: World, outside: Path, runtime_dir: Path,
    person: subprocess.Popen[bytes],
) -> None:
    """Attack 6: a tmux-like socket in ``/tmp`` (also named by ``SSH_AUTH_SOCK``),
    one in ``$XDG_RUNTIME_DIR``, an abstract one, and a process of the person's:
    no listener accepts a connection, and the process lives on."""
    in_tmp = listening(str(outside / "default"))
    in_runtime = listening(str(runtime_dir / "bus"))
    name = f"prohost-person-{os.getpid()}-{id(world)}"
    abstract = listening("\0" + name)
    world.env["SSH_AUTH_SOCK"] = str(outside / "default")
    world.env["XDG_RUNTIME_DIR"] = str(runtime_dir)
    tool = attacker(f"connect:{outside / 'default'}", f"connect:{runtime_dir / 'bus'}",
                    f"abstract:{name}", "env-connect:SSH_AUTH_SOCK", f"kill:{person.pid}")
    try:
        with trio.fail_after(60):
            async with running_server() as server, world.harness(server, tool):
                _, completion = await attacked(server)
        assert completion["confined"] is True
        assert not accepted_any(in_tmp), "the run reached a socket of the person's in /tmp"
        assert not accepted_any(in_runtime), "the run reached a socket in $XDG_RUNTIME_DIR"
        assert not accepted_any(abstract), "the run reached an abstract socket"
        assert person.poll() is None, "the run signalled a process of the person's"
    finally:
        for listener in (in_tmp, in_runtime, abstract):
            listener.close()


async def test_a_socket_in_a_readable_place_of_the_home_is_out_of_reach(
    world: World,
) -> None:
    """Attack 6, in the home: Docker Desktop keeps its socket in ``~/.docker/run``
    and an editor or tmux server may keep one in any folder of the person's, which
    the run may read (only ``~/.docker/config.json`` is a secret). A read-only view
    does not stop ``connect``; the seccomp filter that refuses ``socket(AF_UNIX)``
    does. Neither listener accepts a connection."""
    folder = world.user / ".docker" / "run"
    folder.mkdir(parents=True)
    docker = listening(str(folder / "docker.sock"))
    (world.user / "work").mkdir()
    editor = listening(str(world.user / "work" / "server"))
    tool = attacker(f"connect:{folder / 'docker.sock'}",
                    f"connect:{world.user / 'work' / 'server'}")
    try:
        with trio.fail_after(60):
            async with running_server() as server, world.harness(server, tool):
                _, completion = await attacked(server)
        assert completion["confined"] is True
        assert not accepted_any(docker), "the run reached ~/.docker/run/docker.sock"
        assert not accepted_any(editor), "the run reached a socket in a folder of the home"
    finally:
        docker.close()
        editor.close()


async def test_an_allowed_socket_is_reached_and_the_run_is_not_said_confined(
    world: World,
) -> None:
    """``--allow-write "$SSH_AUTH_SOCK"`` lets the agent use the person's ssh-agent
    (§13). The filter cannot tell one Unix socket from another, so it is off: the
    allowed socket is reached, and so could any other in a readable place of the
    home be; the completion says ``"confined": false`` and the status says why."""
    agent = listening(str(world.user / "agent.sock"))
    world.env["SSH_AUTH_SOCK"] = str(world.user / "agent.sock")
    try:
        with trio.fail_after(60):
            async with running_server() as server, world.harness(
                server, attacker("env-connect:SSH_AUTH_SOCK"),
                allow_write=(world.user / "agent.sock",),
            ) as running:
                _, completion = await attacked(server)
                snapshot = running.harness.snapshot()
        assert accepted_any(agent), "the socket --allow-write names was not reached"
        assert completion["confined"] is False
        assert snapshot.confinement is not None
        assert snapshot.confinement.startswith("partly confined (")
        assert f"--allow-write names a socket ({world.user / 'agent.sock'})" in \
            snapshot.confinement
    finally:
        agent.close()


#: The time attacker.py's utime sets (1 January 2001).
ATTACK_TIME = 978307200


def marks(path: Path) -> tuple[int, int]:
    found = os.stat(path)
    return found.st_mode, found.st_mtime_ns


async def test_modes_and_times_outside_the_runs_places_do_not_change(
    world: World,
) -> None:
    """Attack 8: chmod and utime of ``$PROHOST_HOME``, its credentials, an SSH key
    and a file of the original checkout: each is as it was."""
    await make_repo(world.source)
    key = world.user / ".ssh" / "id_rsa"
    key.write_text("a private key\n")
    key.chmod(0o600)
    targets = [world.home, world.home / "credentials.json", key, world.source / "README"]
    tool = attacker(*(f"{action}:{target}" for target in targets
                      for action in ("chmod", "utime")))
    with trio.fail_after(60):
        async with running_server() as server, world.harness(
            server, tool, repos=(world.source,),
        ):
            before = {target: marks(target) for target in targets}
            await attacked(server)
    after = {target: marks(target) for target in targets}
    assert {target: mode for target, (mode, _) in after.items()} == \
        {target: mode for target, (mode, _) in before.items()}
    # The harness itself writes in its home meanwhile: the attack's time is not there.
    assert all(mtime // 10**9 != ATTACK_TIME for _, mtime in after.values())
    assert {target: marks for target, marks in after.items() if target != world.home} == \
        {target: marks for target, marks in before.items() if target != world.home}


def processes_of(run_id: str) -> list[int]:
    """The processes, anywhere on this machine, started for run ``run_id``."""
    needle = f"PROHOST_RUN_ID={run_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if needle in environ.split(b"\0"):
                found.append(int(entry))
    return found


async def test_no_process_of_a_run_outlives_its_completion(
    world: World,
) -> None:
    """Attack 9: a process left by ``setsid`` and a double fork is gone by the time
    the completion is posted."""
    with trio.fail_after(60):
        async with running_server() as server, world.harness(server, attacker("orphan:600")):
            run_id, _ = await attacked(server)
            left = processes_of(run_id)
    for pid in left:
        os.kill(pid, 9)
    assert left == [], "a process of the run outlived its completion"


async def test_the_persons_terminal_cannot_be_written(world: World) -> None:
    """Attack 11: the person's ``/dev/pts/N`` gets nothing from a run."""
    master, slave = os.openpty()
    terminal = os.ttyname(slave)
    os.set_blocking(master, False)
    try:
        with trio.fail_after(60):
            async with running_server() as server, world.harness(
                server, attacker(f"tty:{terminal}"),
            ):
                await attacked(server)
        with pytest.raises(BlockingIOError):
            got = os.read(master, 1024)
            pytest.fail(f"the run wrote to the person's terminal: {got!r}")
    finally:
        os.close(master)
        os.close(slave)
