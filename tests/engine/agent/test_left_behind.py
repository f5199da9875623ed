"""What an agent leaves in its process group when it exits (run_agent, real processes).

An ACP adapter exits at the end of its conversation and its CLI, sent SIGTERM,
writes the session's transcript as it leaves; swept with SIGKILL the moment the
adapter was gone, under load the CLI had written nothing, and the next run could
not resume the session (CI: the real claude-agent-acp answered the second turn's
session/resume "Resource not found"). So what is left gets SIGTERM and the grace
to end; a zombie, which has ended, does not make the harness wait.

The grace is 600 s here and each test gives up after 60: a harness that waited for
the whole grace fails it (a bound on a hang, not a measure of speed).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

from prohost.engine.agent.launch import Launch
from prohost.engine.agent.process import ProcessGroups
from prohost.engine.sandbox import Confinement, Policy, prepare, probe
from tests.kits.harness import wall_clock_bound
from tests.kits.output import Heard, run_agent
from tests.kits.paths import AGENTS

pytestmark = [pytest.mark.protocol("§5"),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]

GRACE_S = 600.0
GIVE_UP_S = 60.0
PR_SET_CHILD_SUBREAPER = 36


#: Each test runs its agent unconfined, and confined as a run is where bubblewrap
#: runs (bubblewrap ends with the agent; its init, with what the agent left).
KINDS = ["unconfined", "bubblewrap"]


@pytest.fixture(params=KINDS)
def confinement(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Confinement | None]:
    if request.param == "unconfined":
        yield None
        return
    support = probe()
    if support.kind != "bwrap":
        pytest.skip(f"no bubblewrap here: {support.reason}")
    with prepare(Policy(writable=(tmp_path,)), support) as made:
        yield made


def pid_state(pid: int, confinement: Confinement | None) -> str | None:
    """``pid``'s state letter as the test sees it (``None``: gone); a pid from a
    PID namespace of bubblewrap's names nothing here: once run_agent has returned
    the namespace is gone, and so is every process of it."""
    return state(pid) if confinement is None else None


@pytest.fixture
def patient_groups() -> ProcessGroups:
    groups = ProcessGroups()
    groups.grace_s = GRACE_S
    return groups


async def run(command: str, tmp_path: Path, groups: ProcessGroups,
              confinement: Confinement | None = None) -> bytes:
    """run_agent's stdout; it fails the test if it waits for the grace."""
    with trio.move_on_after(GIVE_UP_S) as waited:
        result = await run_agent(
            Launch(command=command, stdin_text="", cwd=tmp_path,
                   env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                   confinement=confinement),
            groups)
    assert not waited.cancelled_caught, "the harness waited for the grace"
    assert result.exit_code == 0
    return result.stdout


async def test_what_the_agent_leaves_gets_to_save_its_work_before_the_sweep(
    tmp_path: Path, patient_groups: ProcessGroups, confinement: Confinement | None,
) -> None:
    await saves_its_work(tmp_path, patient_groups, confinement)


async def test_on_a_still_clock_the_end_of_what_was_left_is_noticed_as_it_happens(
    tmp_path: Path, patient_groups: ProcessGroups, mock_clock: trio.testing.MockClock,
    confinement: Confinement | None,
) -> None:
    # trio's mock clock, which only a test moves, as the tests of a run's budget
    # use: a wait that looked again after a pause of trio's clock never looked
    # again there (CI). Each process left is watched through a pidfd instead.
    await saves_its_work(tmp_path, patient_groups, confinement)


async def saves_its_work(tmp_path: Path, patient_groups: ProcessGroups,
                         confinement: Confinement | None) -> None:
    saved, pidfile = tmp_path / "saved", tmp_path / "child.pid"
    command = shlex.join([sys.executable, str(AGENTS / "leaves_a_saver.py"),
                          str(saved), str(pidfile)])
    try:
        async with wall_clock_bound(GIVE_UP_S):
            stdout = await run(command, tmp_path, patient_groups, confinement)
        assert stdout == b"ready\n"
        # Told to stop, it saved: SIGKILLed at once, it had not.
        assert saved.read_text() == "saved"
        assert pid_state(int(pidfile.read_text()), confinement) in (None, "Z")  # it has ended
    finally:
        if pidfile.exists() and confinement is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)


async def test_a_stopped_agent_s_leftovers_get_the_grace_too(
    tmp_path: Path, patient_groups: ProcessGroups, confinement: Confinement | None,
) -> None:
    # The run is cancelled once the agent is ready (as a cancel, a timeout or the
    # linger after a conversation stop it): the group's SIGTERM ends the leader at
    # once, and what it left must still get the rest of the grace to save.
    saved, pidfile = tmp_path / "saved", tmp_path / "child.pid"
    command = shlex.join([sys.executable, str(AGENTS / "leaves_a_saver.py"),
                          str(saved), str(pidfile), "--then-wait"])
    ready = trio.Event()
    try:
        async with wall_clock_bound(GIVE_UP_S), trio.open_nursery() as nursery:
            async def run_it() -> None:
                await run_agent(
                    Launch(command=command, stdin_text="", cwd=tmp_path,
                           env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                           confinement=confinement),
                    patient_groups, output=Heard(on_line=lambda line: ready.set()))

            nursery.start_soon(run_it)
            await ready.wait()
            nursery.cancel_scope.cancel()
        assert saved.read_text() == "saved"
        assert pid_state(int(pidfile.read_text()), confinement) in (None, "Z")
    finally:
        if pidfile.exists() and confinement is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)


#: The grace of the tests whose regression would wait for it (then SIGKILL, and
#: nothing saved): long beside a save, short for a test that fails.
SHORT_GRACE_S = 20.0


@pytest.fixture
def short_groups() -> ProcessGroups:
    groups = ProcessGroups()
    groups.grace_s = SHORT_GRACE_S
    return groups


@pytest.fixture
def bubblewrap(tmp_path: Path) -> Iterator[Confinement]:
    support = probe()
    if support.kind != "bwrap":
        pytest.skip(f"no bubblewrap here: {support.reason}")
    with prepare(Policy(writable=(tmp_path,)), support) as made:
        yield made


async def test_what_the_agent_leaves_outside_its_group_gets_sigterm_and_the_grace(
    tmp_path: Path, short_groups: ProcessGroups, bubblewrap: Confinement,
) -> None:
    # Confined, a process that started a session of its own is still in the run's
    # PID namespace: it is told to stop as the group is, and saves (SIGKILLed at
    # the grace's end, it had not).
    saved, pidfile = tmp_path / "saved", tmp_path / "child.pid"
    command = shlex.join([sys.executable, str(AGENTS / "leaves_a_saver.py"),
                          str(saved), str(pidfile), "--setsid"])
    async with wall_clock_bound(GIVE_UP_S):
        stdout = await run(command, tmp_path, short_groups, bubblewrap)
    assert stdout == b"ready\n"
    assert saved.read_text() == "saved"


async def test_a_stopped_agent_s_leftovers_outside_its_group_get_the_grace_too(
    tmp_path: Path, short_groups: ProcessGroups, bubblewrap: Confinement,
) -> None:
    saved, pidfile = tmp_path / "saved", tmp_path / "child.pid"
    command = shlex.join([sys.executable, str(AGENTS / "leaves_a_saver.py"),
                          str(saved), str(pidfile), "--then-wait", "--setsid"])
    ready = trio.Event()
    async with wall_clock_bound(GIVE_UP_S), trio.open_nursery() as nursery:
        async def run_it() -> None:
            await run_agent(
                Launch(command=command, stdin_text="", cwd=tmp_path,
                       env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                       confinement=bubblewrap),
                short_groups, output=Heard(on_line=lambda line: ready.set()))

        nursery.start_soon(run_it)
        await ready.wait()
        nursery.cancel_scope.cancel()
    assert saved.read_text() == "saved"


@pytest.mark.parametrize(("command", "code", "killed_by"),
                         [("exit 3", 3, None), ("exit 0", 0, None),
                          ("kill -TERM $$", None, signal.SIGTERM),
                          ("kill -KILL $$", None, signal.SIGKILL)])
async def test_the_agent_s_own_ending_comes_through_bubblewrap(
    tmp_path: Path, groups: ProcessGroups, bubblewrap: Confinement, command: str,
    code: int | None, killed_by: int | None,
) -> None:
    # bubblewrap ends with the agent's status, shell style (128+N for signal N):
    # the run says the agent's own ending, as an unconfined run does.
    with trio.fail_after(GIVE_UP_S):
        result = await run_agent(
            Launch(command=command, stdin_text="", cwd=tmp_path,
                   env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                   confinement=bubblewrap),
            groups)
    assert (result.exit_code, result.signal) == (code, killed_by)


def state(pid: int) -> str | None:
    """``pid``'s state letter (``None``: gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


@contextlib.contextmanager
def orphans_come_to_this_process() -> Iterator[None]:
    """This process as the subreaper that never reaps: the container whose init is
    the harness (``docker run`` without ``--init``), where an agent's orphans stay
    zombies in its group."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        pytest.skip(f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(ctypes.get_errno())}")
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


async def test_a_zombie_left_in_the_group_does_not_hold_the_harness(
    tmp_path: Path, patient_groups: ProcessGroups,
) -> None:
    # The leader's child has exited and nobody reaps it: once the leader is gone it
    # is this process's zombie, in the agent's group, until the test reaps it.
    # (Not subprocess.Popen: its finalizer would reap the child as the leader exits.)
    leader = ("import os; child = os.fork() or os._exit(0)\n"
              "os.waitid(os.P_PID, child, os.WEXITED | os.WNOWAIT)\n"
              "print(child, flush=True)")
    with orphans_come_to_this_process():
        stdout = await run(shlex.join([sys.executable, "-c", leader]), tmp_path,
                                 patient_groups)
        zombie = int(stdout)
        try:
            assert state(zombie) == "Z"
        finally:
            await trio.to_thread.run_sync(os.waitpid, zombie, 0)
