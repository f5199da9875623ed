"""The thread readied ahead of a confined spawn (issue 29's cost): it is in the
domain before the spawn is asked of it, spawns once, and never outlives its
confinement; without it, the spawn is made the usual way."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import attrs

from prohost.engine.sandbox import RuleCache, prepare
from tests.engine.sandbox.conftest import SUPPORT, Home, needs_landlock

pytestmark = needs_landlock


def spawner_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate()
            if thread.name == "prohost-confined-spawn"]


class Delivered:
    """What the readied thread hands back, and from which thread."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = ""

    def __call__(self, result: Any, error: BaseException | None) -> None:
        self.result, self.error = result, error
        self.thread = threading.current_thread().name
        self.done.set()


def script(home: Home, marker: Path) -> list[str]:
    return ["sh", "-c", f"echo x > {marker} || echo denied; cat {home.root}/.ssh/id_ed25519"
                        f" || echo hidden; echo y > {home.work}/out && echo wrote"]


def test_the_readied_thread_spawns_confined_once_and_is_joined(home: Home) -> None:
    marker = home.root / "from-thread"
    delivered = Delivered()
    with prepare(home.policy(), SUPPORT) as confinement:
        confinement.ready_spawner()
        assert len(spawner_threads()) == 1
        asked = confinement.spawn_soon(lambda: subprocess.run(
            script(home, marker), capture_output=True, text=True, check=False), delivered)
        assert asked
        assert delivered.done.wait(60)
        # One spawn each: the next is made the usual way.
        assert not confinement.spawn_soon(lambda: None, Delivered())
    assert delivered.error is None and delivered.thread == "prohost-confined-spawn"
    assert delivered.result.stdout.split() == ["denied", "hidden", "wrote"]
    assert not marker.exists()
    assert spawner_threads() == []
    # This process is as free as before.
    marker.write_text("still free\n")


def test_an_unused_readied_thread_ends_with_its_confinement(home: Home) -> None:
    with prepare(home.policy(), SUPPORT) as confinement:
        confinement.ready_spawner()
        assert len(spawner_threads()) == 1
    assert spawner_threads() == []


def test_a_readied_thread_that_waited_too_long_takes_no_spawn(home: Home) -> None:
    with prepare(home.policy(), SUPPORT) as confinement:
        confinement.ready_spawner(first_wait_s=0.0)
        assert confinement._spawner is not None
        thread = confinement._spawner._thread
        thread.join(60)  # it gives up at once
        assert not thread.is_alive()
        assert not confinement.spawn_soon(lambda: None, Delivered())


def test_a_readied_thread_that_cannot_enter_the_domain_never_spawns(home: Home) -> None:
    confinement = prepare(home.policy(), SUPPORT)
    ruleset = confinement._ruleset
    assert ruleset is not None
    os.close(ruleset.fd)  # the kernel will refuse restrict_self: EBADF
    spawned: list[bool] = []
    delivered = Delivered()
    confinement.ready_spawner()
    assert confinement.spawn_soon(lambda: spawned.append(True), delivered)
    assert delivered.done.wait(60)
    assert isinstance(delivered.error, OSError) and delivered.error.errno == 9  # EBADF
    assert spawned == []
    ruleset.fd = -1
    confinement.close()
    assert spawner_threads() == []


def test_unconfined_there_is_no_thread_to_ready(home: Home) -> None:
    from prohost.engine.sandbox import Confinement

    unconfined = Confinement()
    unconfined.ready_spawner()
    assert spawner_threads() == []
    assert not unconfined.spawn_soon(lambda: None, Delivered())


def test_a_thread_readied_ahead_checks_its_rules_then_spawns(home: Home) -> None:
    """Made ahead, it waits with no bound; the run that takes it has it check the
    rules first (from inside the domain: its ``stat`` calls are not refused), then
    spawn; closed unused after a check, it ends."""
    cache = RuleCache(recent_ns=0)
    try:
        support = attrs.evolve(SUPPORT, rules=cache)
        with prepare(home.policy(), support) as ahead:
            ahead.ready_spawner(first_wait_s=None)
            checked = Delivered()
            assert ahead.check_soon(checked)
            assert checked.done.wait(60)
            assert checked.error is None and checked.thread == "prohost-confined-spawn"
            assert isinstance(checked.result, bool)  # a shared /tmp may have changed
            spawned = Delivered()
            assert ahead.spawn_soon(lambda: subprocess.run(
                ["sh", "-c", f"cat {home.root}/.ssh/id_ed25519 || echo hidden"],
                capture_output=True, text=True, check=False), spawned)
            assert spawned.done.wait(60)
            assert spawned.result.stdout.split() == ["hidden"]
        with prepare(home.policy(), support) as unused:
            unused.ready_spawner(first_wait_s=None)
            checked = Delivered()
            assert unused.check_soon(checked)
            assert checked.done.wait(60)
    finally:
        cache.close()
    assert spawner_threads() == []
