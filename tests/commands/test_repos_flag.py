"""``--repos`` given more than once (issue 20, point 11): every value counts, in order,
for ``agent run`` and for the service ``agent install-daemon`` writes; a checkout
named twice is refused in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from prohost import cli
from prohost.options import OptionError, Options, options_from_args
from tests.kits.daemon import fake_manager, fake_program, install_env, pair, parse_unit, round_trip
from tests.kits.paths import ROOT


def checkouts(root: Path, *names: str) -> list[Path]:
    """Folders that pass for git checkouts (a .git folder: no subprocess when parsing)."""
    for name in names:
        (root / name / ".git").mkdir(parents=True)
    return [root / name for name in names]


def parse(argv: list[str], cwd: Path, **kwargs: bool) -> Options:
    ns = cli.build_parser().parse_args(argv)
    return options_from_args(ns, {"HOME": str(cwd / "me")}, cwd, **kwargs)


def prohost(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prohost", *args], env=env, cwd=cwd, capture_output=True,
        text=True, timeout=60, check=False,
    )


def test_repeated_repos_are_joined_in_order(tmp_path: Path) -> None:
    app, lib, docs = checkouts(tmp_path, "app", "lib", "docs")
    for command in (["agent", "run"], ["agent", "install-daemon"]):
        repeated = parse([*command, "--repos", "app", "--repos", "lib,docs"], tmp_path,
                         require_checkouts=True)
        assert repeated.repos == (app, lib, docs)
        assert parse([*command, "--repos", "app,lib,docs"], tmp_path) == repeated
    assert parse(["agent", "run", "--repos", "docs", "--repos", "app"], tmp_path).repos == (
        docs, app)


ONCE = "; give each checkout once"


@pytest.mark.parametrize(
    ("values", "named", "tail"),
    [
        (["app", "app"], "app", " twice" + ONCE),
        (["app", "./lib/../app/"], "app", " twice (as 'app' and as './lib/../app/')" + ONCE),
        (["app,lib", "lib"], "lib", " twice" + ONCE),
    ],
)
def test_a_checkout_named_twice_is_refused(
    tmp_path: Path, values: list[str], named: str, tail: str
) -> None:
    checkouts(tmp_path, "app", "lib")
    argv = ["agent", "run"]
    for value in values:
        argv += ["--repos", value]
    message = f"--repos names {tmp_path / named}{tail}"
    with pytest.raises(OptionError) as caught:
        parse(argv, tmp_path)
    assert str(caught.value) == message

    # As a person meets it: exit 2 and one line, before anything is started.
    env = {key: value for key, value in os.environ.items() if not key.startswith("PROHOST_")}
    env["PROHOST_HOME"] = str(tmp_path / "home")
    result = prohost(tmp_path, env, *argv)
    assert result.returncode == 2
    assert (result.stdout, result.stderr) == ("", f"prohost agent run: error: {message}\n")
    assert not (tmp_path / "home").exists()


def test_the_service_gets_every_repeated_repo(tmp_path: Path) -> None:
    """`agent install-daemon --print --repos app --repos lib`: the unit's command line
    carries both, and reads back as the same options."""
    env = install_env(tmp_path)
    pair(env)
    fake_program(tmp_path, "claude")
    fake_manager(tmp_path, "systemctl")
    app, lib = checkouts(tmp_path, "app", "lib")
    result = prohost(tmp_path, env, "agent", "install-daemon", "--print",
                     "--repos", "app", "--repos", "lib")
    assert result.returncode == 0, result.stderr
    program = parse_unit(result.stdout).program
    assert program[program.index("--repos") + 1] == f"{app},{lib}"
    assert round_trip(program, env, Path("/")).repos == (app, lib)


def test_the_help_says_the_flag_repeats() -> None:
    result = prohost(ROOT, dict(os.environ), "agent", "run", "--help")
    assert "given by repeating the flag" in " ".join(result.stdout.split())
