"""$PROHOST_HOME: credentials on disk, endpoint resolution, the single-instance lock, pairing."""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
from pathlib import Path
from typing import Any

import pytest
import trio

from prohost import AGENT_HEADER_VALUE
from prohost.commands.pair import pair_command
from prohost.home import (
    DEFAULT_WS_URL,
    Credentials,
    CredentialsError,
    InstanceLock,
    LockHeld,
    http_base_from_ws,
    load_credentials,
    lock_held_message,
    lock_holder,
    prohost_home,
    read_lock_holder,
    resolve_endpoints,
    save_credentials,
)
from prohost.invocation import command
from tests.kits.asgi import serving
from tests.kits.lockholder import start_holder, stop_holder
from tests.kits.pairing import GOOD_ANSWER, pair_app, ws_url

CREDS = Credentials(
    token="tok-SECRET-1",
    secret="sec-SECRET-2",
    ws_url="wss://agents.example/v1/agent/ws",
    api_url="https://api.example",
    account="acme",
)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- home --------------------------------------------------------------------------


def test_prohost_home(tmp_path: Path) -> None:
    assert prohost_home({"PROHOST_HOME": str(tmp_path / "h")}) == tmp_path / "h"
    assert prohost_home({"HOME": str(tmp_path)}) == tmp_path / ".prohost"
    assert prohost_home({"PROHOST_HOME": "rel"}, tmp_path) == tmp_path / "rel"
    assert prohost_home({"PROHOST_HOME": "~/x", "HOME": str(tmp_path)}) == tmp_path / "x"
    assert prohost_home({"PROHOST_HOME": "rel"}).is_absolute()


# --- credentials -------------------------------------------------------------------


@pytest.mark.protocol("§10")
def test_credentials_round_trip_is_0600_and_atomic(tmp_path: Path) -> None:
    home = tmp_path / "home"
    old_umask = os.umask(0)  # a file created without an explicit mode would be 0666 now
    try:
        path = save_credentials(home, CREDS)
    finally:
        os.umask(old_umask)
    assert path == home / "credentials.json"
    assert mode(path) == 0o600
    assert mode(home) == 0o700
    assert os.listdir(home) == ["credentials.json"]  # no temp file left behind
    assert load_credentials(home) == CREDS

    # Overwriting replaces the whole file and keeps it private.
    newer = Credentials(token="t2", secret="s2", ws_url="ws://127.0.0.1:1/v1/agent/ws")
    save_credentials(home, newer)
    assert load_credentials(home) == newer
    assert mode(path) == 0o600
    assert os.listdir(home) == ["credentials.json"]
    assert json.loads(path.read_text()) == {
        "token": "t2",
        "secret": "s2",
        "ws_url": "ws://127.0.0.1:1/v1/agent/ws",
    }


@pytest.mark.protocol("§1")
def test_credentials_repr_hides_the_secrets() -> None:
    text = repr(CREDS)
    assert "tok-SECRET-1" not in text
    assert "sec-SECRET-2" not in text
    assert "acme" in text


def test_missing_credentials_say_to_pair(tmp_path: Path) -> None:
    with pytest.raises(CredentialsError) as info:
        load_credentials(tmp_path)
    message = str(info.value)
    # The command it names runs as printed (the code and URL from the server).
    assert command("agent", "pair", "--code", "CODE", "--url", "URL") in message
    assert "the command its banner prints" in message and "web app" in message
    assert str(tmp_path / "credentials.json") in message


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", "not valid JSON"),
        ("", "not valid JSON"),
        ("[]", "not a JSON object"),
        ('{"token": "t", "ws_url": "wss://x/ws"}', "'secret'"),
        ('{"secret": "s", "ws_url": "wss://x/ws"}', "'token'"),
        ('{"token": "t", "secret": "s"}', "'ws_url'"),
        ('{"token": "", "secret": "s", "ws_url": "wss://x/ws"}', "'token'"),
        ('{"token": 5, "secret": "s", "ws_url": "wss://x/ws"}', "'token'"),
        ('{"token": "t", "secret": "s", "ws_url": "https://x/ws"}', "'ws_url'"),
        ('{"token": "t", "secret": "s", "ws_url": "wss://x/ws", "api_url": 3}', "'api_url'"),
    ],
)
def test_corrupt_credentials_say_what_and_what_to_do(
    tmp_path: Path, content: str, expected: str
) -> None:
    (tmp_path / "credentials.json").write_text(content)
    with pytest.raises(CredentialsError) as info:
        load_credentials(tmp_path)
    message = str(info.value)
    assert expected in message
    assert "prohost agent pair" in message
    assert str(tmp_path / "credentials.json") in message


def test_unreadable_credentials(tmp_path: Path) -> None:
    (tmp_path / "credentials.json").mkdir()
    with pytest.raises(CredentialsError, match="is a directory"):
        load_credentials(tmp_path)


def test_credentials_without_read_permission(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = save_credentials(tmp_path, CREDS)
    path.chmod(0)
    if os.access(path, os.R_OK):
        # Root reads whatever the mode says; make the read fail the way it would
        # for anyone else, so the message is checked in CI (which runs as root) too.
        def denied(self: Path, *args: object, **kwargs: object) -> str:
            raise PermissionError(13, "Permission denied", str(self))

        monkeypatch.setattr(Path, "read_text", denied)
    with pytest.raises(CredentialsError, match="permission denied"):
        load_credentials(tmp_path)


def test_credentials_ignore_unknown_fields(tmp_path: Path) -> None:
    (tmp_path / "credentials.json").write_text(
        json.dumps({"token": "t", "secret": "s", "ws_url": "ws://h:1/ws", "future": 1})
    )
    assert load_credentials(tmp_path) == Credentials(token="t", secret="s", ws_url="ws://h:1/ws")


# --- endpoints (PROTOCOL §1) -------------------------------------------------------

NO_API = Credentials(token="t", secret="s", ws_url="wss://paired.example:444/v1/agent/ws")


@pytest.mark.protocol("§1")
@pytest.mark.parametrize(
    ("url", "creds", "expected"),
    [
        # --url / $PROHOST_WS_URL wins, and the API base comes from it, not the credentials.
        ("ws://127.0.0.1:8765/v1/agent/ws", CREDS, ("ws://127.0.0.1:8765/v1/agent/ws",
                                                    "http://127.0.0.1:8765")),
        ("wss://dev.example/v1/agent/ws", None, ("wss://dev.example/v1/agent/ws",
                                                 "https://dev.example")),
        ("ws://[::1]:9/ws", None, ("ws://[::1]:9/ws", "http://[::1]:9")),
        # Otherwise the credentials: their api_url ...
        (None, CREDS, (CREDS.ws_url, "https://api.example")),
        ("", CREDS, (CREDS.ws_url, "https://api.example")),
        (None, Credentials(token="t", secret="s", ws_url="wss://a/ws", api_url="https://b/"),
         ("wss://a/ws", "https://b")),
        # ... else derived from their ws_url.
        (None, NO_API, (NO_API.ws_url, "https://paired.example:444")),
        # Nothing at all: the built-in default.
        (None, None, (DEFAULT_WS_URL, "https://api.prohost.ai")),
    ],
)
def test_resolve_endpoints(
    url: str | None, creds: Credentials | None, expected: tuple[str, str]
) -> None:
    assert resolve_endpoints(url, creds) == expected


@pytest.mark.protocol("§1")
@pytest.mark.parametrize(
    "url", ["http://h/ws", "https://h/ws", "ftp://h", "h:1/ws", "ws://", "ws://h:port/ws", ""]
)
def test_http_base_from_ws_refuses_other_urls(url: str) -> None:
    with pytest.raises(ValueError, match=r"ws:// or wss://|no host|port"):
        http_base_from_ws(url)


# --- the single-instance lock ------------------------------------------------------

def test_lock_held_by_another_process(tmp_path: Path) -> None:
    home = tmp_path / "home"
    child = start_holder(home)
    try:
        with pytest.raises(LockHeld) as info:
            InstanceLock.acquire(home)
        assert info.value.pid == child.pid
        message = lock_held_message(info.value, home)
        assert f"pid {child.pid}" in message
        # The next step, runnable as printed: stop the other one, or give this one
        # its own home, paired (a new home has no credentials).
        assert f"kill {child.pid}" not in message
        assert f"`{command('agent', 'stop')}` finishes its runs in progress" in message
        assert f"PROHOST_HOME={home}" in message
        pair = command("agent", "pair", "--code", "CODE", "--url", "URL")
        run = command("agent", "run")
        assert (f"`PROHOST_HOME=/some/other/dir {pair}`, then "
                f"`PROHOST_HOME=/some/other/dir {run} ...`") in message

        assert child.stdin is not None
        child.stdin.close()  # the child finishes reading stdin and exits
        assert child.wait(timeout=30) == 0
    finally:
        stop_holder(child)

    with InstanceLock.acquire(home) as lock:
        assert lock.held
        assert (home / "agent.lock").read_text() == f"{os.getpid()} harness\n"
    assert not lock.held


def test_lock_is_released_when_the_holder_is_killed(tmp_path: Path) -> None:
    child = start_holder(tmp_path)
    try:
        with pytest.raises(LockHeld):
            InstanceLock.acquire(tmp_path)
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        stop_holder(child)
    # A stale pid is still in the file, but the kernel dropped the lock with the process.
    InstanceLock.acquire(tmp_path).release()


def test_lock_in_one_process(tmp_path: Path) -> None:
    lock = InstanceLock.acquire(tmp_path)
    assert mode(tmp_path / "agent.lock") == 0o600
    with pytest.raises(LockHeld) as info:
        InstanceLock.acquire(tmp_path)
    assert info.value.pid == os.getpid()
    lock.release()
    lock.release()  # idempotent
    assert (tmp_path / "agent.lock").read_text() == ""  # no pid of a process that let go
    InstanceLock.acquire(tmp_path).release()


def test_who_holds_the_lock_is_read_back_with_what_it_is(tmp_path: Path) -> None:
    assert lock_holder(tmp_path) is None  # no lock file: nothing is made either
    assert not (tmp_path / "agent.lock").exists()
    for kind, pid_recorded in (("harness", True), ("gc", True), ("unrecorded", False)):
        child = start_holder(tmp_path, kind)  # type: ignore[arg-type]
        try:
            held = lock_holder(tmp_path)
            assert held is not None
            assert held.pid == (child.pid if pid_recorded else None)
            assert held.kind == (kind if pid_recorded else None)
        finally:
            stop_holder(child)
        assert lock_holder(tmp_path) is None


def test_a_lock_file_with_a_pid_alone_is_an_earlier_harness_s(tmp_path: Path) -> None:
    path = tmp_path / "agent.lock"
    for text, expected in (("123\n", (123, "harness")), ("123 gc\n", (123, "gc")),
                           ("123 harness\n", (123, "harness")), ("123 other\n", (123, None)),
                           ("", (None, None)), ("0\n", (None, None)), ("x gc", (None, None))):
        path.write_text(text)
        fd = os.open(path, os.O_RDONLY)
        try:
            assert read_lock_holder(fd) == expected, text
        finally:
            os.close(fd)


def test_a_gc_holding_the_home_is_named_to_a_second_harness(tmp_path: Path) -> None:
    message = lock_held_message(LockHeld(42, tmp_path / "agent.lock", "gc"), tmp_path)
    assert f"`{command('agent', 'gc')}` (pid 42)" in message
    assert "start again once it is done" in message


def test_only_a_holder_that_said_nothing_may_be_a_gc(tmp_path: Path) -> None:
    path = tmp_path / "agent.lock"
    gc = f"if it is `{command('agent', 'gc')}`"
    assert gc not in lock_held_message(LockHeld(7, path), tmp_path)
    assert gc in lock_held_message(LockHeld(None, path, None), tmp_path)


def test_lock_message_without_a_pid(tmp_path: Path) -> None:
    message = lock_held_message(LockHeld(None, tmp_path / "agent.lock"), tmp_path)
    assert "already running" in message
    assert f"PROHOST_HOME={tmp_path}" in message
    assert "lsof" in message and "agent stop" not in message  # no pid to stop it by
    assert f"then `PROHOST_HOME=/some/other/dir {command('agent', 'run')} ...`" in message


# --- pairing against a tiny ASGI server --------------------------------------------

async def pair_with(
    status: int, answer: object, home: Path, seen: list[dict[str, Any]] | None = None
) -> int:
    """``prohost agent pair ABCD-1234 --machine studio`` against a server that answers
    every request with ``status`` and ``answer`` (recorded in ``seen``); its exit code."""
    with trio.fail_after(30):
        async with serving(pair_app(status, answer, [] if seen is None else seen)) as base:
            return await pair_command("ABCD-1234", ws_url(base), "studio", home)


@pytest.mark.protocol("§10")
async def test_pair_saves_credentials(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    seen: list[dict[str, Any]] = []
    code = await pair_with(200, GOOD_ANSWER, home, seen)
    assert code == 0
    assert len(seen) == 1
    assert seen[0]["method"] == "POST"
    assert seen[0]["path"] == "/v1/agent/pair"
    assert seen[0]["json"] == {"code": "ABCD-1234", "machine": "studio"}
    assert seen[0]["headers"]["x-prohost-agent"] == AGENT_HEADER_VALUE

    path = home / "credentials.json"
    assert mode(path) == 0o600
    assert load_credentials(home) == Credentials(**GOOD_ANSWER)
    out, err = capsys.readouterr()
    assert str(path) in out
    assert "acme" in out
    for secret in ("tok-SECRET-1", "sec-SECRET-2"):
        assert secret not in out + err


@pytest.mark.protocol("§10")
async def test_pair_refused_prints_the_servers_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    answer = {"error": "this pairing code has expired"}
    code = await pair_with(403, answer, home)
    assert code == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert "403 Forbidden" in err
    assert "this pairing code has expired" in err
    assert not home.exists()


@pytest.mark.protocol("§10")
@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ({k: v for k, v in GOOD_ANSWER.items() if k != "secret"}, "'secret'"),
        ({**GOOD_ANSWER, "ws_url": "https://x/ws"}, "'ws_url'"),
        (b"<html>hello</html>", "not JSON"),
    ],
)
async def test_pair_refuses_an_incomplete_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], answer: object, expected: str
) -> None:
    home = tmp_path / "home"
    code = await pair_with(200, answer, home)
    assert code == 1
    _, err = capsys.readouterr()
    assert err.count("\n") == 1
    assert expected in err
    assert "nothing was saved" in err
    assert not home.exists()


@pytest.mark.protocol("§10")
async def test_pair_connection_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    # Bound but not listening: connecting is refused, and nobody else can take the port.
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        with trio.fail_after(30):
            code = await pair_command("ABCD-1234", f"ws://127.0.0.1:{port}/ws", "studio", home)
    assert code == 1
    _, err = capsys.readouterr()
    assert err.count("\n") == 1
    assert f"cannot connect to http://127.0.0.1:{port}" in err
    assert not home.exists()


# --- private files (issue 8, reproduction 6) -----------------------------------------


def test_a_loose_home_is_narrowed_with_a_warning_and_its_files_are_private(
    tmp_path: Path, umask_022: None, caplog: pytest.LogCaptureFixture
) -> None:
    from prohost.engine.ledger import Ledger
    from prohost.logfile import log_path, log_to_file

    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    os.chmod(home, 0o755)
    with InstanceLock.acquire(home):
        assert mode(home) == 0o700
        assert "was open to other users (mode 0755); narrowed it to 0700" in caplog.text
        assert mode(home / "runs") == 0o700
        with Ledger.open(home / "ledger.sqlite3") as ledger:
            ledger.admit("run-1", "lane", '{"mcp": {"token": "t"}}', now=1.0)
            for name in ("ledger.sqlite3", "ledger.sqlite3-wal", "ledger.sqlite3-shm"):
                assert mode(home / name) == 0o600, name
        save_credentials(home, CREDS)
        assert mode(home / "credentials.json") == 0o600
        logger = logging.getLogger("prohost.test_private")
        assert log_to_file(home, logger_name=logger.name) == log_path(home)
        try:
            logger.warning("a line")
            assert mode(log_path(home).parent) == 0o700
            assert mode(log_path(home)) == 0o600
        finally:
            for handler in list(logger.handlers):
                logger.removeHandler(handler)
                handler.close()


def test_an_old_world_readable_ledger_is_narrowed_on_open(
    tmp_path: Path, umask_022: None
) -> None:
    from prohost.engine.ledger import Ledger

    path = tmp_path / "ledger.sqlite3"
    with Ledger.open(path) as ledger:
        ledger.admit("run-1", "lane", "{}", now=1.0)
    for name in ("ledger.sqlite3", "ledger.sqlite3-wal", "ledger.sqlite3-shm"):
        if (tmp_path / name).exists():
            os.chmod(tmp_path / name, 0o644)
    with Ledger.open(path) as ledger:
        ledger.admit("run-2", "lane", "{}", now=2.0)
        for name in ("ledger.sqlite3", "ledger.sqlite3-wal", "ledger.sqlite3-shm"):
            assert mode(tmp_path / name) == 0o600, name


def test_a_new_home_is_0700_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o277)  # would make an unusable 0500 folder
    try:
        InstanceLock.acquire(tmp_path / "home").release()
    finally:
        os.umask(old)
    assert mode(tmp_path / "home") == 0o700
    assert mode(tmp_path / "home" / "runs") == 0o700
