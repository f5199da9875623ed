"""The service installer's test pieces: a shell with a home, PATH and credentials of
its own, fake systemctl/launchctl programs that record their calls, and a small
independent parser that reads a systemd unit back the way systemd does (specifiers,
quoting, C escapes, ``$$``), so that what a service would run can be compared with
what the user typed.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

import attrs

from prohost import cli
from prohost.commands.service import ServiceSpec, service_spec
from prohost.home import Credentials, save_credentials
from prohost.options import Options, options_from_args

#: The paired home's credentials: never in a unit, a plist or the output.
TOKEN = "tok-0123456789-SECRET"
SECRET = "sec-9876543210-SECRET"


def parse_run(argv: list[str], env: Mapping[str, str], cwd: Path) -> Options:
    """``argv`` through the real parser and ``options_from_args``."""
    ns = cli.build_parser().parse_args(argv)
    return options_from_args(ns, env, cwd)


def round_trip(program: list[str], env: Mapping[str, str], cwd: Path) -> Options:
    """What the service would run: program must be `<this python> -m prohost agent run ...`."""
    assert program[:3] == [sys.executable, "-m", "prohost"]
    assert program[3:5] == ["agent", "run"]
    return parse_run(program[3:], env, cwd)


_C_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'", "s": " ", "r": "\r"}


def _undouble(value: str, char: str, lone: str) -> str:
    """``char`` doubled stands for one ``char``; a lone one would be ``lone`` (a
    substitution systemd would make), which must not appear."""
    out, i = [], 0
    while i < len(value):
        if value[i] == char:
            assert value[i + 1 : i + 2] == char, f"{lone} in {value!r}"
            out.append(char)
            i += 2
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def _specifiers(value: str) -> str:
    """systemd's first pass over a value: %% is %, and no other specifier may appear."""
    return _undouble(value, "%", "unescaped specifier")


def systemd_split(value: str) -> list[str]:
    """Words of a systemd value per systemd.syntax(7) "Quoting" (the subset with quotes,
    C escapes \\n \\t \\\\ \\" \\' \\s \\xHH), after the specifier pass."""
    value = _specifiers(value)
    words: list[str] = []
    i, n = 0, len(value)
    while True:
        while i < n and value[i] in " \t":
            i += 1
        if i >= n:
            return words
        word: list[str] = []
        quote: str | None = None
        while i < n:
            char = value[i]
            if quote is None and char in " \t":
                break
            if char == "\\":
                nxt = value[i + 1]
                if nxt == "x":
                    word.append(chr(int(value[i + 2 : i + 4], 16)))
                    i += 4
                    continue
                assert nxt in _C_ESCAPES, f"unknown escape \\{nxt} in {value!r}"
                word.append(_C_ESCAPES[nxt])
                i += 2
                continue
            if quote is None and char in "\"'":
                quote = char
            elif char == quote:
                quote = None
            else:
                word.append(char)
            i += 1
        assert quote is None, f"unterminated quote in {value!r}"
        words.append("".join(word))


def exec_dollars(word: str) -> str:
    """ExecStart's last pass: $$ is $, and a $NAME would be substituted (must not occur)."""
    return _undouble(word, "$", "variable substitution")


@attrs.frozen
class ParsedUnit:
    program: list[str]
    working_directory: Path
    environment: dict[str, str]
    settings: dict[str, list[str]]


def parse_unit(text: str) -> ParsedUnit:
    settings: dict[str, list[str]] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        settings.setdefault(key, []).append(value.strip())
    (exec_start,) = settings["ExecStart"]
    (workdir,) = settings["WorkingDirectory"]
    environment = {}
    for value in settings["Environment"]:
        for assignment in systemd_split(value):
            name, _, val = assignment.partition("=")
            environment[name] = val
    return ParsedUnit(
        program=[exec_dollars(word) for word in systemd_split(exec_start)],
        working_directory=Path(_specifiers(workdir)),
        environment=environment,
        settings=settings,
    )


def install_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """An installing shell: fake HOME, its own PROHOST_HOME, PATH = tmp/bin only."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    env = {
        "HOME": str(tmp_path / "user"),
        "PROHOST_HOME": str(tmp_path / "prohost home"),
        "PATH": str(bin_dir),
        "LANG": "C.UTF-8",
    }
    env.update(extra)
    return env


def fake_program(tmp_path: Path, name: str, body: str = "exit 0") -> Path:
    """A shell script called ``name`` in the shell's PATH (``tmp_path/bin``)."""
    path = tmp_path / "bin" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def fake_manager(tmp_path: Path, name: str, exit_code: int = 0) -> Path:
    """A systemctl/launchctl that records each call's arguments, one line per call."""
    record = tmp_path / f"{name}.calls"
    fake_program(tmp_path, name, f"printf '%s\\n' \"$*\" >> '{record}'\nexit {exit_code}")
    return record


def calls(record: Path) -> list[str]:
    """The calls a :func:`fake_manager` recorded, one line each."""
    return record.read_text().splitlines() if record.exists() else []


def pair(env: Mapping[str, str]) -> Path:
    """Credentials in the shell's ``PROHOST_HOME``; that home."""
    home = Path(env["PROHOST_HOME"])
    save_credentials(home, Credentials(token=TOKEN, secret=SECRET, ws_url="ws://127.0.0.1:9/ws"))
    return home


def spec_for(env: Mapping[str, str], tmp_path: Path, *flags: str) -> tuple[Options, ServiceSpec]:
    """``agent run`` with ``flags`` in a shell with ``env``: its options and service."""
    options = parse_run(["agent", "run", *flags], env, tmp_path)
    return options, service_spec(options, env)
