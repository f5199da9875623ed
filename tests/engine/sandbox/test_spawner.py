"""Spawns under bubblewrap's scope-only Landlock domain, shared by every run: one
thread enters it once and spawns them all (:meth:`Confinement.spawn_soon`)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from prohost.engine.sandbox import Confinement, landlock
from prohost.engine.sandbox import confinement as confinement_module

from .conftest import SUPPORT

needs_scopes = pytest.mark.skipif(SUPPORT.abi < landlock.SCOPES_ABI,
                                  reason="no Landlock scopes here (ABI 6)")

#: A child that says whether it may signal the process that started the test.
SIGNAL = "import os, sys\ntry:\n    os.kill(int(sys.argv[1]), 0)\nexcept PermissionError:\n" \
         "    print('EPERM')\nelse:\n    print('ok')\n"


def spawned(confined: Confinement) -> tuple[subprocess.Popen[bytes] | None, BaseException | None]:
    done = threading.Event()
    got: list[tuple[subprocess.Popen[bytes] | None, BaseException | None]] = []

    def deliver(popen: subprocess.Popen[bytes] | None, error: BaseException | None) -> None:
        got.append((popen, error))
        done.set()

    confined.spawn_soon(lambda: subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", SIGNAL, str(os.getpid())], stdout=subprocess.PIPE),
        deliver)
    assert done.wait(30), "the spawn was never delivered"
    return got[0]


def shared() -> Confinement:
    ruleset = confinement_module._scopes(SUPPORT.abi)
    return Confinement(keeper=True, ruleset=ruleset, shared=True)


def said(popen: subprocess.Popen[bytes] | None) -> str:
    assert popen is not None
    out, _ = popen.communicate(timeout=30)
    return out.decode().strip()


@needs_scopes
def test_every_run_sharing_the_scopes_is_spawned_scoped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(confinement_module, "_SPAWNERS", {})
    for _ in range(3):
        popen, error = spawned(shared())
        assert error is None
        assert said(popen) == "EPERM"  # outside its domain: not signalled
    os.kill(os.getpid(), 0)  # the test's own thread is not in the domain


@needs_scopes
def test_a_spawn_whose_thread_cannot_enter_fails_and_the_next_tries_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(confinement_module, "_SPAWNERS", {})
    real = landlock.restrict_this_thread
    calls: list[int] = []

    def once_refused(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:
            raise OSError(1, "Operation not permitted")
        real(fd)

    monkeypatch.setattr(landlock, "restrict_this_thread", once_refused)
    popen, error = spawned(shared())
    assert popen is None and isinstance(error, OSError)
    popen, error = spawned(shared())
    assert error is None
    assert said(popen) == "EPERM"
