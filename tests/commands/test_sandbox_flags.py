"""``--sandbox``, ``--allow-write`` and ``--allow-read`` (docs/protocol.md §13): parsed
strictly (exit 2 with one line), explained by ``--help``, refused where
``required`` cannot be met, and carried by ``install-daemon`` into the service."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from prohost.commands.service import harness_arguments, service_spec, systemd_unit
from tests.kits.daemon import install_env, parse_run, parse_unit, round_trip
from tests.kits.no_sandbox import program
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
    """A machine the probe finds no way to confine on (tests/kits/no_sandbox.py):
    ``required`` refuses to start, before anything connects or the home is made."""
    none = program("none")
    done = run_cli(tmp_path, "agent", "run", "--sandbox", "required", program=none)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "--sandbox required: this system cannot confine agents: " in line
    assert "--sandbox auto" in line
    assert not (tmp_path / "home").exists()
    installed = run_cli(tmp_path, "agent", "install-daemon", "--sandbox", "required",
                        "--print", program=none)
    assert installed.returncode == 2, installed.stderr
    assert "cannot confine agents" in installed.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="bubblewrap and Landlock are Linux's")
def test_required_where_only_landlock_confines_exits_2_naming_what_is_not_covered(
        tmp_path: Path) -> None:
    """Without bubblewrap, Landlock alone covers only part of §13: ``required``
    refuses, naming the points that do not hold (the seccomp filter keeps its runs
    off Unix sockets: not one of them)."""
    from prohost.engine.sandbox import probe

    if not probe().abi:
        pytest.skip("no Landlock here")
    done = run_cli(tmp_path, "agent", "run", "--sandbox", "required",
                   program=program("bwrap"))
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "--sandbox required: this system confines agents only in part" in line
    assert "outlive" in line and "modes" in line and "Unix sockets" not in line
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


@pytest.mark.parametrize(("flags", "reason"), [
    (["--workdir", "~"], "--workdir {user} is your home folder"),
    (["--workdir", "{tmp}"], "--workdir {tmp} holds"),
    (["--allow-write", "~"], "--allow-write {user} holds"),
    (["--allow-write", "{tmp}"], "--allow-write {tmp} holds"),
    (["--allow-write", "~/.config"], "--allow-write {user}/.config holds"),
    (["--account", "me=~/.claude"], "--account me={user}/.claude is a folder your own"),
])
def test_a_grant_that_would_uncover_a_hidden_place_is_refused_at_start(
    tmp_path: Path, flags: list[str], reason: str,
) -> None:
    """Issue 36, attack 11: ``--workdir ~`` or an ``--allow-write`` above
    ``$PROHOST_HOME`` or a secret store would open what every run must not see
    while the harness said confined: refused, exit 2, saying why and what to do,
    before anything connects or the home is made."""
    user = tmp_path / "user"
    (user / ".ssh").mkdir(parents=True)
    (user / ".config" / "gh").mkdir(parents=True)
    (user / ".claude").mkdir()
    env = program_env(tmp_path, HOME=str(user))
    args = [flag.format(tmp=tmp_path) for flag in flags]
    done = run_cli(tmp_path, "agent", "run", "--brain", "plain", "--exec", "true", *args,
                   env=env)
    assert done.returncode == 2, done.stderr
    assert reason.format(user=user, tmp=tmp_path) in done.stderr, done.stderr
    assert "name a folder" in done.stderr or "a folder of its own" in done.stderr
    assert not (tmp_path / "home").exists()


def test_required_with_a_granted_socket_exits_2_saying_what_it_turns_off(
    tmp_path: Path,
) -> None:
    """A socket granted writable turns the socket filter off (§13: the person's other
    sockets become reachable): ``required`` refuses it, naming the grant."""
    import socket

    if not sys.platform.startswith("linux"):
        pytest.skip("the socket filter is bubblewrap's (Linux)")
    from prohost.engine.sandbox import probe

    if probe().kind != "bwrap":
        pytest.skip(f"no bubblewrap here: {probe().reason}")
    agent = tmp_path / "agent.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(agent))
        env = program_env(tmp_path, SSH_AUTH_SOCK=str(agent))
        done = run_cli(tmp_path, "agent", "run", "--sandbox", "required",
                       "--allow-write", str(agent), env=env)
        auto = run_cli(tmp_path, "agent", "run", "--sandbox", "required", env=env)
    assert done.returncode == 2
    line = done.stderr.strip().splitlines()[-1]
    assert f"--allow-write grants the socket {agent}" in line
    assert "--sandbox auto" in line
    # Without the grant it gets past the check (and stops later: no pairing here).
    assert "grants the socket" not in auto.stderr


def test_a_grant_inside_the_acp_agent_s_own_folder_is_refused_at_start(
    tmp_path: Path,
) -> None:
    """An ACP agent's own folder (``~/.gemini``) is shown to its runs as an overlay
    whose writes land in the harness's folder (§13: a run never writes the
    person's agent settings), so an ``--allow-write`` inside it would have no
    effect while the person believes it granted: refused, exit 2, saying why and
    what to do, before anything is made. The same grant with an agent that is not
    that one is no concern of this check."""
    user = tmp_path / "user"
    (user / ".gemini" / "tmp").mkdir(parents=True)
    gemini = tmp_path / "bin" / "gemini"
    gemini.parent.mkdir()
    gemini.write_text("#!/bin/sh\nexit 0\n")
    gemini.chmod(0o755)
    env = program_env(tmp_path, HOME=str(user))
    for grant in ("~/.gemini/tmp", "~/.gemini"):
        done = run_cli(tmp_path, "agent", "run", "--exec", f"{gemini} --experimental-acp",
                       "--allow-write", grant, env=env)
        assert done.returncode == 2, done.stderr
        line = done.stderr.strip().splitlines()[-1]
        shown = str(user / grant.removeprefix("~/"))
        assert f"--allow-write {shown} is inside ~/.gemini" in line, line
        assert "overlay" in line and "grant a folder outside it" in line, line
        assert not (tmp_path / "home").exists()
    plain = run_cli(tmp_path, "agent", "run", "--brain", "plain", "--exec", "true",
                    "--allow-write", "~/.gemini/tmp", env=env)
    assert "is inside ~/.gemini" not in plain.stderr, plain.stderr
