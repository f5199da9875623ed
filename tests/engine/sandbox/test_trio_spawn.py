"""The confined trio spawn: a real trio.Process, confined, its pipes trio's."""

from __future__ import annotations

import subprocess

import pytest
import trio

from prohost.engine.sandbox import SIMULATE_ABSENT_ENV, Policy, prepare, probe
from prohost.engine.sandbox.trio_spawn import open_process
from tests.engine.sandbox.conftest import SUPPORT, Home, needs_landlock


@needs_landlock
async def test_a_trio_process_started_confined(home: Home) -> None:
    confinement = await trio.to_thread.run_sync(prepare, home.policy(), SUPPORT)
    with confinement:
        proc = await open_process(
            confinement, ["sh", "-c", f"read line; echo got $line; "
                                      f"echo x > {home.root}/nope || echo denied >&2"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    await proc.stdin.send_all(b"hello\n")
    await proc.stdin.aclose()
    out = b"".join([chunk async for chunk in proc.stdout])
    err = b"".join([chunk async for chunk in proc.stderr])
    assert await proc.wait() == 0
    assert out == b"got hello\n"
    assert b"denied" in err
    assert not (home.root / "nope").exists()


async def test_unconfined_it_is_trios_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SIMULATE_ABSENT_ENV, "1")
    with prepare(Policy(), probe()) as confinement:
        proc = await open_process(confinement, ["sh", "-c", "echo free"],
                                  stdout=subprocess.PIPE)
    assert proc.stdout is not None
    out = b"".join([chunk async for chunk in proc.stdout])
    assert await proc.wait() == 0
    assert out == b"free\n"


async def test_a_missing_program_is_an_oserror(home: Home) -> None:
    with prepare(home.policy(), SUPPORT) as confinement, pytest.raises(OSError):
        await open_process(confinement, ["/nonexistent/program"], stdout=subprocess.PIPE)
