"""``--sandbox``, ``--allow-write`` and ``--allow-read`` (docs/protocol.md §13): parsed
strictly (exit 2 with one line), explained by ``--help``, refused where
``required`` cannot be met, and carried by ``install-daemon`` into the service."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from prohost.commands.service import harness_arguments, service_spec, systemd_unit
from prohost.engine.sandbox import SIMULATE_ABSENT_ENV
from tests.kits.daemon import install_env, parse_run, parse_unit, round_trip
from tests.kits.program import program_env, run_cli

pytestmark = pytest.mark.protocol("§13")


def test_the_flags_default_to_auto_and_nothing_opened(tmp_path: Path) -> None:
    options = parse_run(["agent", "run"], install_env(tmp_path), tmp_path)
    assert (options.sandbox, options.allow_write, options.allow_read) == ("auto", (), ())


def test_paths_are_absolute_expanded_and_kept_in_order(tmp_path: Path) -> None:
    env = install_env(tmp_path)
    user = Path(env["HOME"])
    (user / ".m2").mkdir(parents=True)
    (user / ".ssh").mkdir()
    (tmp_path / "logs").mkdir()
    options = parse_run(["agent", "run", "--allow-write", "~/.m2", "--allow-write", "logs",
                         "--allow-read", "~/.ssh", "--sandbox", "required"], env, tmp_path)
    assert options.allow_write == (user / ".m2", tmp_path / "logs")
    assert options.allow_read == (user / ".ssh",)
    assert options.sandbox == "required"


@pytest.mark.parametrize(("flags", "message"), [
    (["--sandbox", "on"], "--sandbox must be one of auto, required, off (got 'on')"),
    (["--allow-write", "missing"], "--allow-write {tmp}/missing: no such file or folder"),
    (["--allow-read", "missing"], "--allow-read {tmp}/missing: no such file or folder"),
    (["--allow-write", " "], "--allow-write must be an existing file or folder"),
    (["--allow-write"], "--allow-write needs a value: an existing file or folder"),
])
def test_a_bad_value_exits_2_on_one_line(tmp_path: Path, flags: list[str],
                                         message: str) -> None:
    done = run_cli(tmp_path, "agent", "run", *flags)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert message.format(tmp=tmp_path) in line
    assert not (tmp_path / "home").exists()


def test_required_where_the_system_cannot_confine_exits_2_saying_why(tmp_path: Path) -> None:
    """The probe's simulated absence (not the kernel's): ``required`` refuses to
    start, before anything connects or the home is made."""
    env = program_env(tmp_path, **{SIMULATE_ABSENT_ENV: "1"})
    done = run_cli(tmp_path, "agent", "run", "--sandbox", "required", env=env)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "--sandbox required: this system cannot confine agents: " in line
    assert "--sandbox auto" in line
    assert not (tmp_path / "home").exists()
    installed = run_cli(tmp_path, "agent", "install-daemon", "--sandbox", "required",
                        "--print", env=env)
    assert installed.returncode == 2, installed.stderr
    assert "cannot confine agents" in installed.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="bubblewrap and Landlock are Linux's")
def test_required_where_only_landlock_confines_exits_2_naming_what_is_not_covered(
        tmp_path: Path) -> None:
    """Without bubblewrap (simulated at the probe), Landlock alone covers only part
    of §13: ``required`` refuses, naming the points that do not hold."""
    from prohost.engine.sandbox import probe

    env = program_env(tmp_path, **{SIMULATE_ABSENT_ENV: "bwrap"})
    if not probe().abi:
        pytest.skip("no Landlock here")
    done = run_cli(tmp_path, "agent", "run", "--sandbox", "required", env=env)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "--sandbox required: this system confines agents only in part" in line
    assert "outlive" in line and "modes" in line and "by path" in line
    assert not (tmp_path / "home").exists()


def test_help_explains_each_flag(tmp_path: Path) -> None:
    for command in (["agent", "run"], ["agent", "install-daemon"]):
        text = " ".join(run_cli(tmp_path, *command, "--help").stdout.split())
        assert "--sandbox MODE confine each agent and everything it starts" in text
        assert "required refuses to start (exit 2)" in text
        assert "--allow-write PATH also let confined agents write" in text
        assert "--allow-read PATH also let confined agents read" in text


def test_a_service_is_installed_with_the_same_confinement(tmp_path: Path) -> None:
    env = install_env(tmp_path)
    (tmp_path / "logs").mkdir()
    (tmp_path / "cache dir").mkdir()
    (tmp_path / "-odd").mkdir()
    flags = ["--sandbox", "required", "--allow-write", "logs", "--allow-write", "cache dir",
             "--allow-read", "./-odd"]
    options = parse_run(["agent", "run", *flags], env, tmp_path)
    args = harness_arguments(options)
    assert args.count("--allow-write") == 2 and "--sandbox" in args
    assert args[args.index("--allow-read") + 1] == str(tmp_path / "-odd")
    assert parse_run(args, env, tmp_path / "elsewhere") == options
    spec = service_spec(options, env)
    assert round_trip(parse_unit(systemd_unit(spec)).program, spec.environment,
                      Path("/")) == options
    off = parse_run(["agent", "run", "--sandbox", "off"], env, tmp_path)
    assert harness_arguments(off)[2:] == ["--sandbox", "off"]
    assert harness_arguments(parse_run(["agent", "run"], env, tmp_path)) == ["agent", "run"]
