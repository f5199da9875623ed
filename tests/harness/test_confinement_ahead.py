"""A run's confinement made ahead, while the harness is idle (issue 29's cost),
through the real harness: the next run takes it only while it is still exactly
what that run's own preparation would make, and is confined the same way.

Real parts throughout: the reference server, the harness, Landlock, the prober
agent (``tests/agents/prober.py``), which replies with the errno each operation met.
"""

from __future__ import annotations

import functools
import logging
import os
import shlex
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from prohost.engine.run import confine
from prohost.engine.run.spares import Spares
from prohost.engine.sandbox import SIMULATE_ABSENT_ENV, RuleCache, probe
from tests.kits.harness import finished, running_harness, running_server
from tests.kits.paths import AGENTS, logs_folder

pytestmark = [
    pytest.mark.protocol("§13"),
    pytest.mark.skipif(probe().kind != "landlock",
                       reason=f"this system cannot confine with Landlock: {probe().reason}"),
]

USED_AHEAD = "confined with the rules made ahead"


class Machine:
    """A person's home with a key in ``~/.ssh``, a working directory, and the
    harness's home beside them; every folder the rules list is aged, so that a
    change made later moves its times for certain."""

    def __init__(self, tmp_path: Path) -> None:
        self.user = tmp_path / "user"
        (self.user / ".ssh").mkdir(parents=True)
        (self.user / ".ssh" / "id_ed25519").write_text("a private key\n")
        (self.user / ".profile").write_text("export EDITOR=vi\n")
        self.workdir = tmp_path / "work"
        self.workdir.mkdir()
        self.home = tmp_path / "home"
        self.home.mkdir()
        self.logs = logs_folder(tmp_path)
        self.tmp = tmp_path
        self.env = {**os.environ, "HOME": str(self.user)}
        self.env.pop(SIMULATE_ABSENT_ENV, None)

    def age(self) -> None:
        for folder in (self.user, self.tmp):
            os.utime(folder, ns=(1_000_000_000, 1_000_000_000))

    def agent(self, *reads: Path) -> str:
        ops = [f"write:workdir:{self.workdir / 'out.txt'}", "write:tmp:$TMPDIR/x.txt",
               f"write:dotfile:{self.user / '.profile'}",
               f"read:ssh_key:{self.user / '.ssh' / 'id_ed25519'}",
               f"read:credentials:{self.home / 'credentials.json'}",
               *(f"read:{path.name}:{path}" for path in reads)]
        return shlex.join([sys.executable, str(AGENTS / "prober.py"), *ops])

    def spare_folders(self) -> list[str]:
        runs = self.home / "runs"
        return sorted(os.listdir(runs)) if runs.exists() else []


CONFINED = {"workdir": "ok", "tmp": "ok", "dotfile": "EACCES", "ssh_key": "EACCES",
            "credentials": "EACCES"}


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Machine:
    monkeypatch.delenv(SIMULATE_ABSENT_ENV, raising=False)
    # The harness's cache does not trust a folder changed in the last 2 s (its
    # times' clock is coarse); this test's folders are aged instead, and each
    # change below moves an mtime off the aged one.
    monkeypatch.setattr(confine, "RuleCache", functools.partial(RuleCache, recent_ns=0))
    return Machine(tmp_path)


@asynccontextmanager
async def harness_of(machine: Machine, agent: str) -> AsyncIterator[tuple[Any, Spares]]:
    """The reference server and a harness running ``agent`` in ``machine``'s working
    directory (no ``--repos``: its runs' confinements are made ahead)."""
    async with running_server() as server, running_harness(
        server, machine.home, exec_command=agent, brain="plain", env=machine.env,
        workdir=machine.workdir, allow_write=(machine.logs,),
    ) as running:
        spares = running.harness.spares
        assert spares is not None
        yield server, spares


def results(completion: dict[str, Any] | None) -> dict[str, str]:
    assert completion is not None and completion["ok"] is True, completion
    assert completion["confined"] is True
    return dict(line.split("=", 1) for line in completion["reply"].splitlines())


async def turn(server: Any, conversation: str) -> dict[str, str]:
    run_id = await server.submit_run("probe", conversation_id=conversation)
    await server.wait_until(finished(run_id))
    return results(server.run(run_id).completion)


def used_ahead(caplog: pytest.LogCaptureFixture) -> int:
    return sum(record.getMessage() == USED_AHEAD for record in caplog.records)


async def test_the_next_run_takes_the_rules_made_ahead_and_is_confined_the_same(
    machine: Machine, caplog: pytest.LogCaptureFixture,
) -> None:
    """Once a run has ended, the next run's confinement is made while the harness
    is idle; the next run takes it (its private ``TMPDIR`` included) and meets the
    same refusals as the first. Nothing of it is left once the harness exits."""
    caplog.set_level(logging.DEBUG, logger="prohost.confine")
    with trio.fail_after(60):
        async with harness_of(machine, machine.agent()) as (server, spares):
            machine.age()
            assert await turn(server, "A") == CONFINED
            # A shared / or /tmp (folders the rules list) may change under the
            # test between a spare's making and its check: then the run makes its
            # own. One spare taken as it is, out of five, is enough.
            for number in range(1, 6):
                await spares.wait_made(number)
                assert len(machine.spare_folders()) == 1  # the spare's; the run's are gone
                assert await turn(server, f"B{number}") == CONFINED
                assert spares.taken == number
                if used_ahead(caplog):
                    break
            await spares.wait_made(number + 1)  # kept when the harness exits
    assert used_ahead(caplog) >= 1
    assert machine.spare_folders() == []


async def test_a_file_made_after_the_rules_were_made_ahead_is_readable_by_the_next_run(
    machine: Machine, caplog: pytest.LogCaptureFixture,
) -> None:
    """The rules made ahead are out of date once the home has a new file: the run
    makes its own, which can read it (as a run made at its start always could)."""
    caplog.set_level(logging.DEBUG, logger="prohost.confine")
    notes = machine.user / "notes.txt"
    with trio.fail_after(60):
        async with harness_of(machine, machine.agent(notes)) as (server, spares):
            machine.age()
            assert await turn(server, "A") == {**CONFINED, "notes.txt": "ENOENT"}
            await spares.wait_made(1)
            notes.write_text("written after the rules were made\n")
            assert await turn(server, "B") == {**CONFINED, "notes.txt": "ok"}
            assert spares.taken == 1
    assert used_ahead(caplog) == 0


async def test_each_spawn_is_made_from_the_thread_readied_with_its_rules(
    machine: Machine, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The thread that enters a run's confinement is started before its spawn (with
    the rules made ahead, while the harness was idle; else beside the run's
    ``started`` fsync), and a run that takes rules made ahead has them checked by
    their watch, without a ``stat`` or a thread of its own; none is left once the
    harness exits."""
    from prohost.engine.sandbox import Confinement

    usual: list[bool] = []
    checked: list[bool] = []
    plain, still_right = Confinement.spawn_from_a_confined_thread, Confinement.still_right

    def counted(self: Confinement, start: Any) -> Any:
        usual.append(True)
        return plain(self, start)

    def counted_check(self: Confinement) -> bool:
        checked.append(True)
        return still_right(self)

    monkeypatch.setattr(Confinement, "spawn_from_a_confined_thread", counted)
    monkeypatch.setattr(Confinement, "still_right", counted_check)
    with trio.fail_after(60):
        async with harness_of(machine, machine.agent()) as (server, spares):
            assert await turn(server, "A") == CONFINED
            await spares.wait_made(1)
            assert await turn(server, "B") == CONFINED
    assert usual == [] and checked == []
    assert [thread for thread in threading.enumerate()
            if thread.name == "prohost-confined-spawn"] == []
