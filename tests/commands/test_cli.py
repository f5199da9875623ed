"""The `prohost` command line: the real program for flag errors and help, main() for dispatch."""

from __future__ import annotations

import logging
import os
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio

from prohost import __version__, cli, logfile
from prohost.home import InstanceLock, load_credentials
from prohost.options import Options
from tests.kits.program import run_cli

DURATION = "a duration of 0 or more: seconds, or a number with s, m or h"
CONCURRENCY = "a whole number from 1 to 16"


@pytest.mark.parametrize(
    ("args", "flag", "accepts"),
    [
        (["--concurrency"], "--concurrency", CONCURRENCY),
        (["--concurrency", "--dry-run"], "--concurrency", CONCURRENCY),
        (["--concurrency", "0"], "--concurrency", CONCURRENCY),
        (["--concurrency", "17"], "--concurrency", CONCURRENCY),
        (["--concurrency", "4x"], "--concurrency", CONCURRENCY),
        (["--concurrency="], "--concurrency", CONCURRENCY),
        (["--timeout", "-5"], "--timeout", DURATION),
        (["--timeout", "abc"], "--timeout", DURATION),
        (["--timeout", "nan"], "--timeout", DURATION),
        (["--timeout"], "--timeout", DURATION),
        (["--idle-timeout", "-1"], "--idle-timeout", DURATION),
        (["--idle-timeout", "--verbose"], "--idle-timeout", DURATION),
        (["--url", "http://example.com/ws"], "--url", "ws:// or wss://"),
        (["--exec"], "--exec", "shell command"),
        (["--machine", ""], "--machine", "1 to 128 characters"),
    ],
)
def test_agent_run_flag_errors(tmp_path: Path, args: list[str], flag: str, accepts: str) -> None:
    result = run_cli(tmp_path, "agent", "run", *args)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"prohost agent run: error: {flag} ")
    assert accepts in lines[0]
    # Refused before anything was touched: not even the home directory exists.
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["agent", "run", "--conc", "4"], "prohost agent run: error: unrecognized arguments"),
        (["agent", "pair"], "prohost agent pair: error: the following arguments are required"),
        (["agent", "pair", "--code"], "prohost agent pair: error: --code needs a value"),
        (["agent", "pair", "--code", "X", "--url", "x"], "prohost agent pair: error: --url must"),
        (["server", "--port", "70000"], "prohost server: error: --port must be a port number"),
        (["server", "--port"], "prohost server: error: --port needs a value"),
        # More digits than Python's int() takes (4,300): a usage error, not a traceback.
        (["server", "--retries", "1" * 5000], "prohost server: error: --retries must be"),
        (["agent", "runs", "--limit", "1" * 5000],
         "prohost agent runs: error: --limit must be a whole number of 1 or more"),
        (["agent", "logs", "--lines", "1" * 5000],
         "prohost agent logs: error: --lines must be a whole number of 0 or more"),
        (["nope"], "prohost: error: argument COMMAND: invalid choice"),
    ],
)
def test_other_usage_errors(tmp_path: Path, args: list[str], expected: str) -> None:
    result = run_cli(tmp_path, *args)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(expected)
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize(
    ("command", "flags"),
    [
        (
            ["agent", "run"],
            [
                "--exec", "--url", "--machine", "--workdir", "--timeout", "--idle-timeout",
                "--concurrency", "--dry-run", "--allow-unverified", "--verbose", "-v",
            ],
        ),
        (["agent", "pair"], ["--code", "--url", "--machine", "--verbose"]),
        (["server"], ["--host", "--port", "--verbose"]),
        (["send"], ["--server", "--conversation", "--wait", "TEXT", "--verbose"]),
        (["demo"], ["--verbose"]),
        (["agent"], ["run", "pair"]),
        ([], ["agent", "server", "send", "demo", "--version"]),
    ],
)
def test_help_lists_every_flag(tmp_path: Path, command: list[str], flags: list[str]) -> None:
    result = run_cli(tmp_path, *command, "--help")
    assert result.returncode == 0
    assert result.stderr == ""
    for flag in flags:
        assert flag in result.stdout, f"{flag} missing from {command} --help"
    assert not (tmp_path / "home").exists()


def test_agent_run_help_states_defaults_and_units(tmp_path: Path) -> None:
    text = " ".join(run_cli(tmp_path, "agent", "run", "--help").stdout.split())
    for fact in ("'claude -p'", "900 seconds", "no limit (default: 0)", "1 to 16", "(default: 1)",
                 "$PROHOST_HOME/workspace", "$PROHOST_WS_URL", "15m", "2h"):
        assert fact in text, fact


def test_version(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "--version")
    assert result.returncode == 0
    assert result.stdout == f"prohost {__version__}\n"


def test_no_command_shows_help(tmp_path: Path) -> None:
    for args in ([], ["agent"]):
        result = run_cli(tmp_path, *args)
        assert result.returncode == 2
        assert "usage: prohost" in result.stderr


# --- dispatch, in process, with a stand-in harness -----------------------------------


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private PROHOST_HOME and cwd; undo main()'s logging set-up afterwards."""
    for key in [k for k in os.environ if k.startswith("PROHOST_")]:
        monkeypatch.delenv(key)
    home = tmp_path / "home"
    monkeypatch.setenv("PROHOST_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    yield home
    if logfile._installed_handler is not None:
        logging.getLogger().removeHandler(logfile._installed_handler)
        logfile._installed_handler = None
    logging.getLogger("prohost").setLevel(logging.NOTSET)


def fake_harness(monkeypatch: pytest.MonkeyPatch, behaviour: Callable[[Options], int]) -> None:
    module = types.ModuleType("prohost.commands.agent")
    module.run_agent_command = behaviour  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "prohost.commands.agent", module)


def test_agent_run_hands_options_to_the_harness(
    env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Options] = []

    def run_agent_command(options: Options, **panel: object) -> int:
        seen.append(options)
        # The harness takes the home's lock itself; the CLI must not hold it already.
        InstanceLock.acquire(options.home).release()
        return 7

    fake_harness(monkeypatch, run_agent_command)
    code = cli.main(
        ["agent", "run", "--concurrency", "3", "--timeout", "15m", "--workdir", "w",
         "--exec", "codex", "--machine", "studio", "--dry-run", "--allow-unverified", "-v"]
    )
    assert code == 7
    assert seen == [
        Options(
            home=env,
            exec_command="codex",
            machine="studio",
            workdir=tmp_path / "w",
            timeout_s=900.0,
            concurrency=3,
            dry_run=True,
            allow_unverified=True,
        )
    ]
    assert logging.getLogger("prohost").getEffectiveLevel() == logging.DEBUG


@pytest.mark.protocol("§1")
def test_agent_run_defaults_and_environment(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Options] = []

    def run_agent_command(options: Options, **panel: object) -> int:
        seen.append(options)
        return 0

    fake_harness(monkeypatch, run_agent_command)
    monkeypatch.setenv("PROHOST_WS_URL", "ws://127.0.0.1:9/v1/agent/ws")
    assert cli.main(["agent", "run"]) == 0
    assert seen == [Options(home=env, url="ws://127.0.0.1:9/v1/agent/ws", machine=seen[0].machine)]
    assert logging.getLogger("prohost").getEffectiveLevel() == logging.INFO


def test_flag_error_never_reaches_the_harness(
    env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def run_agent_command(options: Options, **panel: object) -> int:
        raise AssertionError("a bad flag must stop the CLI before the harness")

    fake_harness(monkeypatch, run_agent_command)
    assert cli.main(["agent", "run", "--concurrency", "17"]) == 2
    assert capsys.readouterr().err == (
        "prohost agent run: error: --concurrency must be a whole number from 1 to 16 (got '17')\n"
    )


def test_ctrl_c_outside_trio_exits_130(
    env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def run_agent_command(options: Options, **panel: object) -> int:
        raise KeyboardInterrupt

    fake_harness(monkeypatch, run_agent_command)
    assert cli.main(["agent", "run"]) == 130
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.protocol("§10")
async def test_agent_pair_end_to_end(tmp_path: Path) -> None:
    """`prohost agent pair` as a user runs it, against a pairing endpoint on 127.0.0.1."""
    from tests.kits.asgi import serving
    from tests.kits.pairing import GOOD_ANSWER, pair_app, ws_url

    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROHOST_")}
    env["PROHOST_HOME"] = str(home)
    seen: list[dict[str, object]] = []
    with trio.fail_after(60):
        async with serving(pair_app(200, GOOD_ANSWER, seen)) as base:
            url = ws_url(base)
            result = await trio.run_process(
                [sys.executable, "-m", "prohost", "agent", "pair", "--code", "ABCD-1234",
                 "--url", url, "--machine", "studio"],
                env=env,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    assert result.returncode == 0, result.stderr
    assert seen[0]["json"] == {"code": "ABCD-1234", "machine": "studio"}
    assert load_credentials(home).token == GOOD_ANSWER["token"]
    output = (result.stdout + result.stderr).decode()
    assert str(home / "credentials.json") in output
    assert GOOD_ANSWER["token"] not in output
    assert GOOD_ANSWER["secret"] not in output
