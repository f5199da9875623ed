"""Strict parsing of `agent run` flags into Options (pure: no files, no network)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from prohost.options import (
    DEFAULT_EXEC,
    DEFAULT_IDLE_TIMEOUT_S,
    MAX_CONCURRENCY,
    MAX_COUNT_DIGITS,
    OptionError,
    Options,
    options_from_args,
    parse_brain,
    parse_concurrency,
    parse_max_queued,
    parse_sandbox,
    parse_seconds,
    whole_number,
)


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [
        ("600", 600.0),
        ("0", 0.0),
        ("0s", 0.0),
        ("90s", 90.0),
        ("1.5m", 90.0),
        ("15m", 900.0),
        ("2h", 7200.0),
        ("0.5", 0.5),
        (".5h", 1800.0),
        ("007", 7.0),
        (" 30s ", 30.0),
    ],
)
def test_parse_seconds_accepts(raw: str, seconds: float) -> None:
    assert parse_seconds("--timeout", raw) == seconds


@pytest.mark.parametrize(
    "raw",
    [
        "",
        " ",
        "-5",
        "-1h",
        "+5",
        "nan",
        "inf",
        "-inf",
        "1e3",
        "abc",
        "5x",
        "5 m",
        "5ms",
        "5d",
        "5M",
        "m",
        "1.2.3",
        "٣",  # a digit, but not an ASCII one
        "9" * 400,  # finite digits, infinite float
        "0x10",
    ],
)
def test_parse_seconds_refuses(raw: str) -> None:
    with pytest.raises(OptionError) as info:
        parse_seconds("--idle-timeout", raw)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("--idle-timeout must be a duration of 0 or more")
    assert "s, m or h" in message
    assert repr(raw) in message


@pytest.mark.protocol("§4")
@pytest.mark.parametrize(
    ("raw", "count"), [("1", 1), ("4", 4), ("16", 16), ("04", 4), (" 8 ", 8), ("016", 16)]
)
def test_parse_concurrency_accepts(raw: str, count: int) -> None:
    assert parse_concurrency(raw) == count


@pytest.mark.protocol("§4")
@pytest.mark.parametrize(
    "raw",
    ["", " ", "0", "00", "17", "100", "-1", "+4", "4x", "4.0", "1e1", "four", "²", "٤", "9" * 5000],
)
def test_parse_concurrency_refuses(raw: str) -> None:
    with pytest.raises(OptionError) as info:
        parse_concurrency(raw)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"--concurrency must be a whole number from 1 to {MAX_CONCURRENCY}")


def ns(**values: object) -> argparse.Namespace:
    return argparse.Namespace(**values)


@pytest.mark.protocol("§4", "§5")
def test_defaults(tmp_path: Path) -> None:
    home = tmp_path / "h"
    options = options_from_args(ns(), {"PROHOST_HOME": str(home)}, tmp_path)
    assert options.home == home
    assert options.exec_command == DEFAULT_EXEC == "claude -p"
    assert options.url is None
    assert options.machine  # the host name
    assert options.workdir == home / "workspace"
    assert options.timeout_s == 0.0
    assert options.idle_timeout_s == DEFAULT_IDLE_TIMEOUT_S == 900.0
    assert options.concurrency == 1
    assert options.dry_run is False
    assert options.allow_unverified is False
    assert not home.exists()  # pure: nothing created


def test_home_defaults_to_dot_prohost(tmp_path: Path) -> None:
    options = options_from_args(ns(), {"HOME": str(tmp_path)}, Path("/"))
    assert options.home == tmp_path / ".prohost"


def test_relative_home_and_workdir_are_made_absolute(tmp_path: Path) -> None:
    options = options_from_args(
        ns(workdir="proj/../code"), {"PROHOST_HOME": "rel-home"}, tmp_path
    )
    assert options.home == tmp_path / "rel-home"
    assert options.workdir == tmp_path / "code"
    assert options.workdir.is_absolute()


def test_tilde_workdir_is_expanded_from_home(tmp_path: Path) -> None:
    env = {"PROHOST_HOME": str(tmp_path / "h"), "HOME": str(tmp_path / "me")}
    options = options_from_args(ns(workdir="~/code"), env, Path("/"))
    assert options.workdir == tmp_path / "me" / "code"


def test_every_flag_reaches_options(tmp_path: Path) -> None:
    options = options_from_args(
        ns(
            exec_command="codex exec",
            url="ws://127.0.0.1:9/v1/agent/ws",
            machine="studio",
            workdir=str(tmp_path / "w"),
            timeout="2h",
            idle_timeout="0",
            concurrency="4",
            dry_run=True,
            allow_unverified=True,
        ),
        {"PROHOST_HOME": str(tmp_path)},
        tmp_path,
    )
    assert options == Options(
        home=tmp_path,
        exec_command="codex exec",
        url="ws://127.0.0.1:9/v1/agent/ws",
        machine="studio",
        workdir=tmp_path / "w",
        timeout_s=7200.0,
        idle_timeout_s=0.0,
        concurrency=4,
        dry_run=True,
        allow_unverified=True,
    )


@pytest.mark.protocol("§1")
def test_url_from_environment(tmp_path: Path) -> None:
    env = {"PROHOST_HOME": str(tmp_path), "PROHOST_WS_URL": "wss://dev.example/v1/agent/ws"}
    assert options_from_args(ns(), env, tmp_path).url == "wss://dev.example/v1/agent/ws"
    # --url wins over the environment.
    flagged = options_from_args(ns(url="ws://localhost:1/ws"), env, tmp_path)
    assert flagged.url == "ws://localhost:1/ws"
    # An empty variable is the same as an unset one.
    empty = {"PROHOST_HOME": str(tmp_path), "PROHOST_WS_URL": ""}
    assert options_from_args(ns(), empty, tmp_path).url is None


@pytest.mark.parametrize(
    ("values", "env", "flag"),
    [
        ({"url": "http://example.com"}, {}, "--url"),
        ({"url": "ws://"}, {}, "--url"),
        ({}, {"PROHOST_WS_URL": "example.com"}, "$PROHOST_WS_URL"),
        ({"machine": ""}, {}, "--machine"),
        ({"machine": "a\nb"}, {}, "--machine"),
        ({"machine": "x" * 129}, {}, "--machine"),
        ({"exec_command": "  "}, {}, "--exec"),
        ({"workdir": ""}, {}, "--workdir"),
        ({"timeout": "-5"}, {}, "--timeout"),
        ({"idle_timeout": "soon"}, {}, "--idle-timeout"),
        ({"concurrency": "17"}, {}, "--concurrency"),
    ],
)
def test_bad_values_name_their_flag(
    tmp_path: Path, values: dict[str, str], env: dict[str, str], flag: str
) -> None:
    with pytest.raises(OptionError) as info:
        options_from_args(ns(**values), {"PROHOST_HOME": str(tmp_path), **env}, tmp_path)
    assert str(info.value).startswith(f"{flag} must be")
    assert "\n" not in str(info.value)


def test_options_is_frozen_and_self_checking(tmp_path: Path) -> None:
    options = Options(home=tmp_path)
    assert options.workdir == tmp_path / "workspace"
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        options.concurrency = 2  # type: ignore[misc]
    for bad in (
        {"concurrency": 0},
        {"concurrency": MAX_CONCURRENCY + 1},
        {"timeout_s": -1.0},
        {"idle_timeout_s": math.inf},
        {"workdir": Path("relative")},
    ):
        with pytest.raises(ValueError):
            Options(home=tmp_path, **bad)
    with pytest.raises(ValueError):
        Options(home=Path("relative"))


@pytest.mark.protocol("§3")
@pytest.mark.parametrize(("raw", "count"), [("1", 1), ("250", 250), (" 10000 ", 10_000),
                                            ("007", 7)])
def test_parse_max_queued_accepts(raw: str, count: int) -> None:
    assert parse_max_queued(raw) == count


@pytest.mark.protocol("§3")
@pytest.mark.parametrize("raw", ["0", "10001", "-3", "1e3", "٤", "", "many", "99999999999"])
def test_parse_max_queued_refuses(raw: str) -> None:
    with pytest.raises(OptionError) as caught:
        parse_max_queued(raw)
    assert str(caught.value) == f"--max-queued must be a whole number from 1 to 10000 (got {raw!r})"


@pytest.mark.parametrize(("parse", "choices"), [
    (parse_brain, ("auto", "acp", "claude", "codex", "plain")),
    (parse_sandbox, ("auto", "required", "off")),
])
def test_a_choice_flag_takes_one_of_its_choices_and_defaults_to_auto(
        parse: Callable[[str | None], str], choices: tuple[str, ...]) -> None:
    assert parse(None) == "auto"
    for choice in choices:
        assert parse(choice) == choice


@pytest.mark.parametrize(("parse", "message"), [
    (parse_brain, "--brain must be one of auto, acp, claude, codex, plain (got 'Claude')"),
    (parse_sandbox, "--sandbox must be one of auto, required, off (got 'Claude')"),
])
def test_a_choice_flag_refuses_anything_else_naming_the_choices(
        parse: Callable[[str | None], str], message: str) -> None:
    with pytest.raises(OptionError) as caught:
        parse("Claude")
    assert str(caught.value) == message


@given(st.text(), st.integers(0, 5), st.one_of(st.none(), st.integers(5, 70000)))
def test_a_count_is_a_whole_number_in_range_or_nothing_whatever_is_typed(
    raw: str, low: int, high: int | None,
) -> None:
    count = whole_number(raw, low, high)
    if count is not None:
        assert low <= count and (high is None or count <= high)
        assert raw.strip().isascii() and int(raw.strip().lstrip("0") or "0") == count


@pytest.mark.parametrize(("raw", "low", "high", "expected"), [
    ("16", 1, 16, 16), (" 007 ", 1, 16, 7), ("0", 0, None, 0), ("17", 1, 16, None),
    ("0", 1, 16, None), ("²", 0, None, None), ("٤", 0, None, None), ("-1", 0, None, None),
    ("1e3", 0, None, None), ("", 0, None, None), ("9" * MAX_COUNT_DIGITS, 0, None,
                                                  int("9" * MAX_COUNT_DIGITS)),
    ("1" * (MAX_COUNT_DIGITS + 1), 0, None, None), ("0" * 5000 + "5", 0, 16, 5),
    # Over Python's 4,300-digit limit for int(): refused, never a ValueError.
    ("1" * 5000, 0, None, None), ("1" * 5000, 0, 100, None),
])
def test_whole_number(raw: str, low: int, high: int | None, expected: int | None) -> None:
    assert whole_number(raw, low, high) == expected
