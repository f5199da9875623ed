"""The service installer: the unit and plist parse back to the very Options they were made
from, carry no prohost secret, and install/uninstall drive a (fake) systemctl/launchctl.

The round trip is the contract: the daemon must run exactly what the user typed, so
each unit is read back the way systemd reads it (specifiers, quoting, C escapes, $$)
by a small independent parser here, and its arguments go through the real
``cli.build_parser()`` and ``options_from_args``.
"""

from __future__ import annotations

import os
import plistlib
import random
import stat
from pathlib import Path

import attrs
import pytest

from prohost.commands import service
from prohost.commands.daemon import install_daemon_command, uninstall_daemon_command
from prohost.commands.service import (
    DaemonError,
    harness_arguments,
    launchd_plist,
    service_label,
    service_spec,
    systemd_unit,
    unit_path,
)
from prohost.engine.report import reporter
from prohost.options import Options
from prohost.startchecks import exec_problem
from tests.kits.daemon import (
    SECRET,
    TOKEN,
    calls,
    fake_manager,
    fake_program,
    install_env,
    parse_run,
    parse_unit,
    round_trip,
    spec_for,
)
from tests.kits.program import run_cli

# --- helpers ------------------------------------------------------------------------


def tree(root: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every path under root with its mode and (for files) content."""
    snapshot: dict[str, tuple[int, bytes | None]] = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        data = path.read_bytes() if stat.S_ISREG(info.st_mode) else None
        snapshot[str(path.relative_to(root))] = (info.st_mode, data)
    return snapshot


# --- harness_arguments: the round trip ----------------------------------------------

FLAG_SETS = [
    [],
    ["--concurrency", "4"],
    ["--exec", "codex exec", "--brain", "codex", "--safe-tools"],
    ["--exec", "  claude -p --model 'opus 4'  "],
    ["--exec=-x --weird", "--machine=-dash"],
    ["--url", " ws://127.0.0.1:8765/v1/agent/ws "],
    ["--machine", "büro-mac ☕"],
    ["--workdir", "rel dir/sub"],
    ["--workdir", "~/code"],
    ["--workdir", "/abs/./x/../y"],
    ["--timeout", "1.5m", "--idle-timeout", "0"],
    ["--timeout", "0.00001", "--idle-timeout", "100000000000000000000000h"],
    ["--timeout", "0.1", "--idle-timeout", "15m"],
    ["--dry-run", "--allow-unverified", "--no-skip-permissions"],
    ["--brain", "plain", "--exec", 'printf "%s $HOME \\n" ; echo \'it\'"s"'],
    ["--exec", "agent\nwith\tcontrol\x01chars"],
    [
        "--exec", "/opt/my agent/bin/run it", "--url", "wss://example.com/ws", "--machine",
        "m", "--workdir", "/tmp/a b", "--timeout", "2h", "--idle-timeout", "90s",
        "--concurrency", "16", "--brain", "claude", "--safe-tools", "--dry-run",
        "--allow-unverified",
    ],
]


def _random_flags(rng: random.Random) -> list[str]:
    pools: dict[str, list[str]] = {
        "--exec": ["claude -p", "codex exec", "x 'y z'", '"q" $V %p', "-dash", "é ü"],
        "--url": ["ws://h:1/p", "wss://example.org/v1/agent/ws"],
        "--machine": ["box", "-m", "name with space", "ünï"],
        "--workdir": ["w", "/tmp/x y", "~", "~/a", "../up", "/"],
        "--timeout": ["0", "1", "0.25", ".5h", "3m", "86400"],
        "--idle-timeout": ["0", "900", "1.75", "10m"],
        "--concurrency": ["1", "2", "09", "16"],
        "--brain": ["auto", "acp", "claude", "codex", "plain"],
    }
    args: list[str] = []
    for flag, values in pools.items():
        if rng.random() < 0.5:
            args.append(f"{flag}={rng.choice(values)}")
    for flag in ("--safe-tools", "--dry-run", "--allow-unverified"):
        if rng.random() < 0.3:
            args.append(flag)
    rng.shuffle(args)
    return args


FLAG_SETS += [_random_flags(random.Random(seed)) for seed in range(150)]


@pytest.mark.parametrize("flags", FLAG_SETS)
def test_harness_arguments_round_trip(tmp_path: Path, flags: list[str]) -> None:
    env = install_env(tmp_path)
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    options = parse_run(["agent", "run", *flags], env, here)
    args = harness_arguments(options)
    assert args[:2] == ["agent", "run"]
    # Read from another directory: the arguments must not depend on the installing cwd.
    assert parse_run(args, env, elsewhere) == options


@pytest.mark.parametrize("flags", [
    ["--account", "work=~/.claude-work", "--account=personal=rel dir"],
    ["--account", "-dash=/tmp/acct -x", "--limit-wait", "90s"],
    ["--limit-wait", "0"],
    ["--max-queued", "50", "--limit-wait", "2m"],
])
def test_accounts_and_limit_wait_round_trip(tmp_path: Path, flags: list[str]) -> None:
    """A service gets every --account, in order, and --limit-wait: a service that
    dropped one would run every conversation on the CLI's default login."""
    env = install_env(tmp_path)
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    for folder in (tmp_path / "user" / ".claude-work", here / "rel dir", Path("/tmp/acct -x")):
        folder.mkdir(parents=True, exist_ok=True)
    options = parse_run(["agent", "run", *flags], env, here)
    assert options.accounts or options.limit_wait_s != 900
    args = harness_arguments(options)
    # --max-queued travels too: a service that dropped it would queue 10,000 runs.
    assert ("--max-queued" in args) == (options.max_queued != 10_000)
    assert parse_run(args, env, elsewhere) == options
    assert args.count("--account") + sum(a.startswith("--account=") for a in args) == \
        len(options.accounts)


def test_harness_arguments_only_non_defaults(tmp_path: Path) -> None:
    env = install_env(tmp_path)
    assert harness_arguments(parse_run(["agent", "run"], env, tmp_path)) == ["agent", "run"]
    options = parse_run(["agent", "run", "--concurrency", "4", "--workdir", "w"], env, tmp_path)
    assert harness_arguments(options) == [
        "agent", "run", "--workdir", str(tmp_path / "w"), "--concurrency", "4",
    ]


def test_an_url_from_the_environment_becomes_a_flag(tmp_path: Path) -> None:
    """The service does not get $PROHOST_WS_URL, so the URL it named must be a flag."""
    env = install_env(tmp_path, PROHOST_WS_URL="ws://dev.local:8765/v1/agent/ws")
    options = parse_run(["agent", "run"], env, tmp_path)
    spec = service_spec(options, env)
    assert "PROHOST_WS_URL" not in spec.environment
    assert round_trip(spec.program, spec.environment, Path("/")) == options
    assert spec.program[-2:] == ["--url", "ws://dev.local:8765/v1/agent/ws"]


def test_every_options_field_is_expressed() -> None:
    """A new Options field must be taught to harness_arguments (or it refuses, below)."""
    assert {field.name for field in attrs.fields(Options)} <= service.EXPRESSED_FIELDS


@attrs.frozen(kw_only=True)
class _WiderOptions(Options):
    future_flag: int = 0


@attrs.frozen(kw_only=True)
class _OptionsWithRepos(Options):
    repos: tuple[Path, ...] = ()


def test_an_unknown_field_is_refused_not_dropped(tmp_path: Path) -> None:
    assert harness_arguments(_WiderOptions(home=tmp_path)) == ["agent", "run"]
    with pytest.raises(DaemonError, match="future_flag"):
        harness_arguments(_WiderOptions(home=tmp_path, future_flag=1))


def test_repos_are_joined_with_commas(tmp_path: Path) -> None:
    options = _OptionsWithRepos(home=tmp_path, repos=(Path("/src/app"), Path("/src/lib b")))
    assert harness_arguments(options) == ["agent", "run", "--repos", "/src/app,/src/lib b"]
    assert harness_arguments(_OptionsWithRepos(home=tmp_path)) == ["agent", "run"]
    for awkward in ("/src/a,b", "/src/trailing "):
        with pytest.raises(DaemonError, match="commas"):
            harness_arguments(_OptionsWithRepos(home=tmp_path, repos=(Path(awkward),)))


# --- the unit and the plist ---------------------------------------------------------

UNIT_CASES = {
    "default": [],
    "everything": FLAG_SETS[16],
    "quotes and spaces": [
        "--exec", """/opt/my agent/run "it" --say 'don\\'t' 100% $HOME ${X} \\ ;""",
        "--workdir", "/tmp/with space/and 'quote\" 50%",
        "--machine", 'a "b" \'c\'',
    ],
    "unicode": ["--exec", "агент -p ✓", "--workdir", "/tmp/café/日本", "--machine", "ünï"],
    "leading dash": ["--exec=-weird", "--machine=-m"],
}


@pytest.mark.parametrize("flags", UNIT_CASES.values(), ids=UNIT_CASES.keys())
def test_systemd_unit_round_trip(tmp_path: Path, flags: list[str]) -> None:
    env = install_env(tmp_path)
    options = parse_run(["agent", "run", *flags], env, tmp_path)
    spec = service_spec(options, env)
    unit = parse_unit(systemd_unit(spec))
    assert unit.program == spec.program
    assert unit.working_directory == options.workdir
    assert unit.environment == spec.environment
    assert round_trip(unit.program, unit.environment, Path("/")) == options


@pytest.mark.parametrize("flags", UNIT_CASES.values(), ids=UNIT_CASES.keys())
def test_launchd_plist_round_trip(tmp_path: Path, flags: list[str]) -> None:
    env = install_env(tmp_path)
    options = parse_run(["agent", "run", *flags], env, tmp_path)
    spec = service_spec(options, env)
    plist = plistlib.loads(launchd_plist(spec).encode())
    assert plist["Label"] == spec.label
    assert plist["WorkingDirectory"] == str(options.workdir)
    assert plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["RunAtLoad"] is True
    assert plist["ExitTimeOut"] == spec.stop_timeout_s
    assert plist["StandardOutPath"] == plist["StandardErrorPath"] == str(spec.stdio_path)
    assert round_trip(plist["ProgramArguments"], plist["EnvironmentVariables"], Path("/")) == (
        options
    )


def test_control_characters_survive_systemd_and_are_refused_by_launchd(tmp_path: Path) -> None:
    env = install_env(tmp_path)
    options = parse_run(["agent", "run", "--exec", "a\x01b\nc"], env, tmp_path)
    spec = service_spec(options, env)
    assert round_trip(parse_unit(systemd_unit(spec)).program, spec.environment, tmp_path) == (
        options
    )
    with pytest.raises(DaemonError, match="plist"):
        launchd_plist(spec)


def test_a_workdir_systemd_cannot_name_is_refused(tmp_path: Path) -> None:
    env = install_env(tmp_path)
    for bad in ("/tmp/new\nline", "/tmp/trailing ", "/tmp/back\\"):
        options = parse_run(["agent", "run", "--workdir", bad], env, tmp_path)
        with pytest.raises(DaemonError, match="--workdir"):
            systemd_unit(service_spec(options, env))


def test_environment_is_an_allow_list_without_the_prohost_secrets(tmp_path: Path) -> None:
    env = install_env(
        tmp_path,
        PROHOST_TOKEN=TOKEN,
        PROHOST_SECRET=SECRET,
        PROHOST_AGENT_TOKEN=TOKEN,
        MY_TOKEN=TOKEN,
        ANTHROPIC_API_KEY="sk-ant-x",
        CODEX_HOME="/tmp/codex",
        LC_ALL="de_DE.UTF-8",
        PROHOST_HOME="relative home",
    )
    options = parse_run(["agent", "run"], env, tmp_path)
    spec = service_spec(options, env)
    assert spec.environment == {
        "HOME": env["HOME"],
        "PATH": env["PATH"],
        "LANG": "C.UTF-8",
        "LC_ALL": "de_DE.UTF-8",
        "ANTHROPIC_API_KEY": "sk-ant-x",
        "CODEX_HOME": "/tmp/codex",
        # Absolute: the service does not start in the installing shell's directory.
        "PROHOST_HOME": str(tmp_path / "relative home"),
        "PROHOST_LOG": "file",
    }
    for text in (systemd_unit(spec), launchd_plist(spec)):
        assert TOKEN not in text
        assert SECRET not in text


def test_labels_differ_per_home_and_are_stable(tmp_path: Path) -> None:
    one, two = service_label(tmp_path / "a"), service_label(tmp_path / "b")
    assert one != two
    assert one == service_label(tmp_path / "a")
    assert one.startswith("ai.prohost.agent.")
    env = install_env(tmp_path)
    spec = service_spec(parse_run(["agent", "run"], env, tmp_path), env)
    assert unit_path(spec, "linux", env) == (
        tmp_path / "user/.config/systemd/user" / f"{spec.label}.service"
    )
    assert unit_path(spec, "darwin", env) == (
        tmp_path / "user/Library/LaunchAgents" / f"{spec.label}.plist"
    )
    with pytest.raises(DaemonError, match="systemd"):
        unit_path(spec, "win32", env)


@pytest.mark.protocol("§9")
@pytest.mark.parametrize(
    ("timeout", "stop"), [("0", 3600), ("1s", 661), ("10m", 1260), ("5h", 3600), ("0.5", 661)]
)
def test_stop_timeout_leaves_room_for_the_drain(tmp_path: Path, timeout: str, stop: int) -> None:
    env = install_env(tmp_path)
    spec = service_spec(parse_run(["agent", "run", "--timeout", timeout], env, tmp_path), env)
    assert spec.stop_timeout_s == stop
    text = systemd_unit(spec)
    unit = parse_unit(text)
    assert unit.settings["TimeoutStopSec"] == [str(stop)]
    assert unit.settings["KillMode"] == ["mixed"]
    assert unit.settings["KillSignal"] == ["SIGTERM"]
    assert unit.settings["Restart"] == ["on-failure"]
    assert unit.settings["Type"] == ["simple"]
    assert unit.settings["WantedBy"] == ["default.target"]
    assert "the first SIGTERM drains" in text


@pytest.mark.protocol("§7", "§9")
def test_the_drain_window_matches_the_reporter() -> None:
    assert service.COMPLETION_RETRY_S == reporter.DEFAULT_WINDOW_S


# --- install / uninstall with systemd -----------------------------------------------


def test_print_writes_nothing(
    tmp_path: Path, paired: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    fake_manager(tmp_path, "systemctl")
    options, spec = spec_for(paired, tmp_path, "--workdir", "not yet made", "--concurrency", "3")
    before = tree(tmp_path)
    assert install_daemon_command(options, print_only=True, env=paired, platform="linux") == 0
    assert tree(tmp_path) == before
    out = capsys.readouterr().out
    assert out == systemd_unit(spec)
    assert round_trip(parse_unit(out).program, spec.environment, Path("/")) == options

    assert install_daemon_command(options, print_only=True, env=paired, platform="darwin") == 0
    assert tree(tmp_path) == before
    assert plistlib.loads(capsys.readouterr().out.encode())["Label"] == spec.label


def test_install_writes_the_unit_and_starts_it(
    tmp_path: Path, paired: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    record = fake_manager(tmp_path, "systemctl")
    options, spec = spec_for(paired, tmp_path, "--workdir", "work dir", "--concurrency", "2")
    assert install_daemon_command(options, print_only=False, env=paired, platform="linux") == 0
    path = tmp_path / "user/.config/systemd/user" / f"{spec.label}.service"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert path.read_text() == systemd_unit(spec)
    assert calls(record) == ["--user daemon-reload", f"--user enable --now {spec.label}.service"]
    assert options.workdir.is_dir()  # created: the service cannot start in a missing one
    assert stat.S_IMODE((options.home / "logs").stat().st_mode) == 0o700
    assert not list(path.parent.glob(".*tmp"))
    out = capsys.readouterr().out
    assert spec.label in out
    assert str(spec.log_path) in out

    # Installing again (new flags) restarts the running service instead of leaving it as is.
    options, spec = spec_for(paired, tmp_path, "--concurrency", "5")
    assert install_daemon_command(options, print_only=False, env=paired, platform="linux") == 0
    assert round_trip(parse_unit(path.read_text()).program, spec.environment, tmp_path) == (
        options
    )
    assert calls(record)[2:] == [
        "--user daemon-reload",
        f"--user enable {spec.label}.service",
        f"--user restart --no-block {spec.label}.service",
    ]


def test_a_unit_holding_an_api_key_is_private(tmp_path: Path, paired: dict[str, str]) -> None:
    fake_manager(tmp_path, "systemctl")
    env = {**paired, "ANTHROPIC_API_KEY": "sk-ant-secret"}
    options, spec = spec_for(env, tmp_path)
    assert install_daemon_command(options, print_only=False, env=env, platform="linux") == 0
    assert stat.S_IMODE(unit_path(spec, "linux", env).stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("platform", "advice"),
    [
        ("linux",
         "systemctl --user daemon-reload && systemctl --user enable --now {label}.service"),
        ("darwin", "launchctl bootstrap gui/{uid} {path}"),
    ],
    ids=["systemd", "launchd"],
)
def test_install_without_the_service_manager_says_what_to_run(
    tmp_path: Path, paired: dict[str, str], capsys: pytest.CaptureFixture[str],
    platform: str, advice: str,
) -> None:
    """No systemctl (launchctl) on PATH: the unit is written all the same, and the
    error says where, and the command to run to load it."""
    options, spec = spec_for(paired, tmp_path)
    assert install_daemon_command(options, print_only=False, env=paired, platform=platform) == 1
    path = unit_path(spec, platform, paired)
    assert path.exists()
    err = capsys.readouterr().err
    assert str(path) in err
    assert advice.format(label=spec.label, uid=os.getuid(), path=path) in err


def test_install_when_systemctl_fails_says_what_to_run(
    tmp_path: Path, paired: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    fake_manager(tmp_path, "systemctl", exit_code=1)
    options, spec = spec_for(paired, tmp_path)
    assert install_daemon_command(options, print_only=False, env=paired, platform="linux") == 1
    err = capsys.readouterr().err
    assert "`systemctl --user daemon-reload` failed" in err
    assert f"systemctl --user enable --now {spec.label}.service" in err


@pytest.mark.parametrize(
    ("flags", "complaint"),
    [
        (["--exec", "not-installed-agent -p"], "not on the PATH the service will get"),
        (["--exec", "./agent.sh"], "not an executable file"),
        (["--workdir", "a-file"], "is not a directory"),
    ],
)
def test_a_bad_flag_fails_the_install_not_the_daemon(
    tmp_path: Path,
    paired: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    complaint: str,
) -> None:
    record = fake_manager(tmp_path, "systemctl")
    (tmp_path / "a-file").write_text("")
    options, _ = spec_for(paired, tmp_path, *flags)
    before = tree(tmp_path)
    for print_only in (True, False):
        assert install_daemon_command(
            options, print_only=print_only, env=paired, platform="linux"
        ) == 2
        out, err = capsys.readouterr()
        assert out == ""
        assert complaint in err
    assert tree(tmp_path) == before
    assert calls(record) == []


def test_exec_checks(tmp_path: Path) -> None:
    home = tmp_path / "home"
    work = tmp_path / "work"
    work.mkdir()
    script = work / "agent.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    fake_program(tmp_path, "claude")
    path = str(tmp_path / "bin")

    def check(line: str) -> str | None:
        return exec_problem(Options(home=home, workdir=work, exec_command=line), path)

    assert check("claude -p") is None
    assert check("FOO=1 claude -p") is None
    assert check("./agent.sh --x") is None  # relative to the workdir, where the agent runs
    assert check(str(script)) is None
    # Shell constructs are the shell's business: not guessed at.
    assert check("cd /x && claude -p") is None
    assert check("$AGENT -p") is None
    # A launcher's program is the one checked (prohost.execline.program_index).
    assert check("env X=1 whatever") is not None
    assert check("env X=1 claude") is None
    assert check("codex exec") is not None
    assert check("/nope/agent") is not None


def test_install_before_pairing_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unpaired harness exits 1 at every start: that would be a restart loop."""
    env = install_env(tmp_path)
    fake_program(tmp_path, "claude")
    record = fake_manager(tmp_path, "systemctl")
    options, spec = spec_for(env, tmp_path)
    assert install_daemon_command(options, print_only=False, env=env, platform="linux") == 1
    assert "not paired" in capsys.readouterr().err
    assert not unit_path(spec, "linux", env).exists()
    assert calls(record) == []


def test_uninstall_stops_disables_and_removes(
    tmp_path: Path, paired: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    record = fake_manager(tmp_path, "systemctl")
    options, spec = spec_for(paired, tmp_path)
    assert install_daemon_command(options, print_only=False, env=paired, platform="linux") == 0
    path = unit_path(spec, "linux", paired)
    capsys.readouterr()

    assert uninstall_daemon_command(paired, options.home, platform="linux") == 0
    assert not path.exists()
    assert calls(record)[-2:] == [
        f"--user disable --now {spec.label}.service",
        "--user daemon-reload",
    ]
    assert f"removed {spec.label}" in capsys.readouterr().out

    # Nothing installed (any more): said plainly, and not an error.
    assert uninstall_daemon_command(paired, options.home, platform="linux") == 0
    assert "no prohost service is installed" in capsys.readouterr().out
    assert len(calls(record)) == 4


def test_uninstall_keeps_the_unit_when_systemd_will_not_stop_it(
    tmp_path: Path, paired: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    options, spec = spec_for(paired, tmp_path)
    path = unit_path(spec, "linux", paired)
    path.parent.mkdir(parents=True)
    path.write_text(systemd_unit(spec))
    fake_manager(tmp_path, "systemctl", exit_code=1)
    assert uninstall_daemon_command(paired, options.home, platform="linux") == 1
    assert path.exists()
    assert f"systemctl --user disable --now {spec.label}.service" in capsys.readouterr().err


def test_uninstall_for_another_home_finds_nothing(
    tmp_path: Path, paired: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    fake_manager(tmp_path, "systemctl")
    options, _ = spec_for(paired, tmp_path)
    assert install_daemon_command(options, print_only=False, env=paired, platform="linux") == 0
    assert uninstall_daemon_command(paired, tmp_path / "other home", platform="linux") == 0
    assert "no prohost service is installed" in capsys.readouterr().out


# --- launchd ------------------------------------------------------------------------


def test_launchd_install_and_uninstall(
    tmp_path: Path, paired: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    record = fake_manager(tmp_path, "launchctl")
    options, spec = spec_for(paired, tmp_path, "--exec", "claude -p --model 'x y'")
    assert install_daemon_command(options, print_only=False, env=paired, platform="darwin") == 0
    path = tmp_path / "user/Library/LaunchAgents" / f"{spec.label}.plist"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    plist = plistlib.loads(path.read_bytes())
    assert round_trip(plist["ProgramArguments"], plist["EnvironmentVariables"], Path("/")) == (
        options
    )
    assert Path(plist["StandardOutPath"]).parent.is_dir()  # launchd does not create folders
    target = f"gui/{os.getuid()}/{spec.label}"
    assert calls(record) == [f"enable {target}", f"bootstrap gui/{os.getuid()} {path}"]

    # Again: the loaded job is booted out first, or bootstrap would refuse it.
    assert install_daemon_command(options, print_only=False, env=paired, platform="darwin") == 0
    assert calls(record)[2] == f"bootout {target}"

    capsys.readouterr()
    assert uninstall_daemon_command(paired, options.home, platform="darwin") == 0
    assert not path.exists()
    assert calls(record)[-1] == f"bootout {target}"
    assert uninstall_daemon_command(paired, options.home, platform="darwin") == 0
    assert "no prohost service is installed" in capsys.readouterr().out


def test_repos_round_trip(tmp_path: Path) -> None:
    env = install_env(tmp_path)
    for name in ("app", "lib b"):
        (tmp_path / name / ".git").mkdir(parents=True)
    options = parse_run(["agent", "run", "--repos", "app, x/../lib b"], env, tmp_path)
    assert parse_run(harness_arguments(options), env, Path("/")) == options


@pytest.mark.parametrize("flags", [
    ["--exec", "gemini --acp", "--acp-model", "gemini-2.5-pro", "--acp-mode=plan"],
    ["--exec", "codex-acp", "--account", "work=/tmp/acp-work", "--acp-model", "work=gpt-5",
     "--acp-model", "o3", "--acp-mode", "work=-auto"],
])
def test_acp_model_and_mode_round_trip(tmp_path: Path, flags: list[str]) -> None:
    """A service keeps --acp-model and --acp-mode, per account: one that dropped them
    would run every session on the agent's default model."""
    env = install_env(tmp_path)
    Path("/tmp/acp-work").mkdir(exist_ok=True)
    options = parse_run(["agent", "run", *flags], env, tmp_path / "here")
    assert options.acp_model and options.acp_mode
    assert parse_run(harness_arguments(options), env, tmp_path / "elsewhere") == options


@pytest.mark.parametrize(("flags", "said"), [
    (["--exec", "claude -p", "--acp-model", "opus"], "not the claude brain"),
    (["--exec", "gemini --acp", "--acp-model", "nobody=x"], "no account is named 'nobody'"),
    (["--exec", "gemini --acp", "--acp-mode", "a", "--acp-mode", "b"], "given twice"),
    (["--exec", "gemini --acp", "--acp-model", "work="], "needs a value"),
])
def test_a_model_or_mode_that_cannot_apply_is_refused_at_start(
    tmp_path: Path, flags: list[str], said: str,
) -> None:
    done = run_cli(tmp_path, "agent", "run", *flags)
    assert done.returncode == 2
    assert said in done.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "home").exists()
