"""The link says what is wrong (issue 31 point 7): an upgrade answered 404 names the
socket's path; "could not connect" until a connection is first greeted, "lost" only
after; and ``prohost agent status`` exits 4 while the harness has never connected.

Real parts: the reference server on 127.0.0.1, the production link (and, for the
status, ``prohost agent run`` and ``prohost agent status`` as subprocesses).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from prohost.commands.status import EXIT_NEVER_CONNECTED
from prohost.engine.link.connection import Link, LinkStatistics, Session
from prohost.wire.protocol import Message
from tests.kits.harness import pair_home, running_server
from tests.kits.process import harness_process
from tests.kits.serverproc import clean_env, prohost

pytestmark = pytest.mark.protocol("§1")


class Quiet:
    """A link handler that does nothing but let the connection be."""

    async def on_session(
        self, session: Session, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()
        await trio.sleep_forever()

    async def on_message(self, session: Session, message: Message) -> None:
        pass


class Watched:
    """A link and a way to wait for its statistics to reach a state."""

    def __init__(self, url: str, token: str) -> None:
        self._changed = trio.Event()
        self.link = Link(url, [(b"Authorization", f"Bearer {token}".encode())], Quiet(),
                         on_change=self._poke)

    def _poke(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait(self, predicate: Callable[[LinkStatistics], bool]) -> LinkStatistics:
        while not predicate(stats := self.link.statistics()):
            await self._changed.wait()
        return stats


def link_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "prohost.link"
            and r.levelno == logging.WARNING]


async def test_a_wrong_path_is_named_and_never_called_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "prohost.link")
    with trio.fail_after(30):
        async with running_server() as server, trio.open_nursery() as nursery:
            token = server.pair("m")["token"]
            # The natural mistake: the address `send --server` takes, without the path.
            wrong = server.ws_url.removesuffix("/v1/agent/ws")
            watched = Watched(wrong, token)
            await nursery.start(watched.link.run)
            stats = await watched.wait(lambda s: s.attempts_failed >= 1)
            nursery.cancel_scope.cancel()
    assert not stats.ever_connected and stats.failures == 0
    assert stats.last_error == f"the server answered 404 at {wrong}: is the path /v1/agent/ws?"
    [line] = link_lines(caplog)
    assert line.startswith(f"could not connect to {wrong} (the server answered 404 at {wrong}: "
                           "is the path /v1/agent/ws?); trying again in ")


async def test_lost_only_after_a_connection_was_up(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "prohost.link")
    with trio.fail_after(30):
        async with running_server() as server, trio.open_nursery() as nursery:
            watched = Watched(server.ws_url, server.pair("m")["token"])
            await nursery.start(watched.link.run)
            await watched.wait(lambda s: s.connected)
            await server.drop_connections()
            stats = await watched.wait(lambda s: s.attempts_failed >= 1)
            nursery.cancel_scope.cancel()
    assert stats.ever_connected and stats.failures == 1
    [line] = link_lines(caplog)
    assert line.startswith(f"connection to {server.ws_url} lost (")


async def test_agent_status_exits_4_while_the_harness_has_never_connected(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with trio.fail_after(60):
        async with running_server() as server:
            pair_home(server, home)
            wrong = server.ws_url.removesuffix("/v1/agent/ws")
            async with harness_process(server, home, "cat", connected=False,
                                       extra_env={"PROHOST_WS_URL": wrong}) as harness:
                await harness.wait_log("is the path /v1/agent/ws?")
                status = await prohost("agent", "status", env=clean_env(home))
                assert status.returncode == EXIT_NEVER_CONNECTED, status
                assert b"has not connected to its server yet" in status.stderr
                assert b"connecting" in status.stdout
                as_json = await prohost("agent", "status", "--json", env=clean_env(home))
                assert as_json.returncode == EXIT_NEVER_CONNECTED
            assert not any("lost" in line for line in harness.log)
            helped = await prohost("agent", "status", "--help", env=clean_env(home))
            assert b"4 an agent is running but has never connected" in helped.stdout
