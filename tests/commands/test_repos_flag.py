"""``--repos`` given more than once (issue 20, point 11): every value counts, in order,
for ``agent run`` and for the service ``agent install-daemon`` writes; a checkout
named twice is refused in one line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from prohost import cli
from prohost.options import OptionError, Options, options_from_args
from tests.kits.daemon import fake_manager, fake_program, install_env, pair, parse_unit, round_trip
from tests.kits.paths import ROOT
from tests.kits.program import run_cli


def checkouts(root: Path, *names: str) -> list[Path]:
    """Folders that pass for git checkouts (a .git folder: no subprocess when parsing)."""
    for name in names:
        (root / name / ".git").mkdir(parents=True)
    return [root / name for name in names]


def parse(argv: list[str], cwd: Path, **kwargs: bool) -> Options:
    ns = cli.build_parser().parse_args(argv)
    return options_from_args(ns, {"HOME": str(cwd / "me")}, cwd, **kwargs)


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
    result = run_cli(tmp_path, *argv)
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
    result = run_cli(tmp_path, "agent", "install-daemon", "--print",
                     "--repos", "app", "--repos", "lib", env=env)
    assert result.returncode == 0, result.stderr
    program = parse_unit(result.stdout).program
    assert program[program.index("--repos") + 1] == f"{app},{lib}"
    assert round_trip(program, env, Path("/")).repos == (app, lib)


def test_the_help_says_the_flag_repeats() -> None:
    result = run_cli(ROOT, "agent", "run", "--help", env=os.environ)
    assert "given by repeating the flag" in " ".join(result.stdout.split())
