"""The service carries the agent CLIs' logins, and keeps them secret (issue 20, point 6).

Under systemd or launchd every run used to fail "not logged in" for anyone who logs
in the headless ways: CLAUDE_CODE_OAUTH_TOKEN, a gateway's ANTHROPIC_AUTH_TOKEN and
ANTHROPIC_BASE_URL, Bedrock or Vertex, CODEX_API_KEY. The installer is run against a
fake systemctl/launchctl (real programs on PATH) and the files it writes are read
back the way the managers read them; ``--pass-env`` and ``--print`` through the real
command line; the harness's log through a real ``prohost agent run`` process.
"""

from __future__ import annotations

import os
import plistlib
import signal
import stat
from pathlib import Path

import pytest
import trio

from prohost.commands.daemon import install_daemon_command
from prohost.commands.service import systemd_unit
from tests.kits.daemon import fake_manager, fake_program, install_env, pair, parse_unit, spec_for
from tests.kits.harness import finished, pair_home, running_server
from tests.kits.paths import ROOT
from tests.kits.process import harness_process
from tests.kits.program import run_cli

OAUTH = "sk-ant-oat01-OAUTH-SECRET-123"
GATEWAY = "gw-bearer-SECRET-456"
CODEX_KEY = "sk-proj-CODEX-SECRET-789"
AWS_SECRET = "aws-SECRET-KEY-abcdef"

LOGINS = {
    "CLAUDE_CODE_OAUTH_TOKEN": OAUTH,
    "ANTHROPIC_AUTH_TOKEN": GATEWAY,
    "ANTHROPIC_BASE_URL": "https://gateway.example/anthropic",
    "CLAUDE_CODE_USE_BEDROCK": "1",
    "AWS_REGION": "eu-west-1",
    "AWS_PROFILE": "work",
    "CLAUDE_CODE_USE_VERTEX": "1",
    "CLOUD_ML_REGION": "global",
    "VERTEX_REGION_CLAUDE_4_6_SONNET": "us-east5",
    "CODEX_API_KEY": CODEX_KEY,
    "HTTPS_PROXY": "http://me:proxy-PASSWORD@proxy.example:3128",
}
#: Set in the installing shell, never carried: an agent's session markers (an install
#: run from inside a Claude or Codex shell), temporary AWS credentials, anything else.
NOT_CARRIED = {
    "CLAUDECODE": "1",
    "CLAUDE_CODE_SESSION_ID": "s-1",
    "CODEX_THREAD_ID": "t-1",
    "AWS_SESSION_TOKEN": "aws-session-SECRET",
    "AWS_ACCESS_KEY_ID": "ASIATEMPORARY",
    "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
    "SOME_TOOL_SETTING": "x",
}
SECRETS = (OAUTH, GATEWAY, CODEX_KEY, "proxy-PASSWORD")


@pytest.fixture
def shell(tmp_path: Path) -> dict[str, str]:
    env = install_env(tmp_path, **LOGINS, **NOT_CARRIED)
    pair(env)
    fake_program(tmp_path, "claude")
    return env


@pytest.mark.parametrize("platform", ["linux", "darwin"])
def test_the_headless_logins_reach_the_service_in_a_private_file(
    tmp_path: Path, shell: dict[str, str], capsys: pytest.CaptureFixture[str], platform: str
) -> None:
    fake_manager(tmp_path, "systemctl" if platform == "linux" else "launchctl")
    options, spec = spec_for(shell, tmp_path)
    assert install_daemon_command(options, print_only=False, env=shell, platform=platform) == 0
    if platform == "linux":
        path = tmp_path / "user/.config/systemd/user" / f"{spec.label}.service"
        environment = parse_unit(path.read_text()).environment
    else:
        path = tmp_path / "user/Library/LaunchAgents" / f"{spec.label}.plist"
        environment = plistlib.loads(path.read_bytes())["EnvironmentVariables"]
    for name, value in LOGINS.items():
        assert environment.get(name) == value, name
    assert not set(NOT_CARRIED) & set(environment)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600

    captured = capsys.readouterr()
    out = captured.out + captured.err
    for secret in SECRETS:
        assert secret not in out
    assert "CLAUDE_CODE_OAUTH_TOKEN" in out  # named, so the person knows where it went
    assert "AWS_SESSION_TOKEN" in captured.err and "not copied" in captured.err


def test_print_and_pass_env_through_the_command_line(tmp_path: Path) -> None:
    env = install_env(tmp_path, **LOGINS, MY_PROVIDER_KEY="custom-SECRET-000",
                      MY_REGION="north")
    env["PATH"] += os.pathsep + os.defpath
    fake_program(tmp_path, "claude")
    base = ["agent", "install-daemon", "--print"]
    result = run_cli(tmp_path, *base, "--pass-env", "MY_PROVIDER_KEY",
                     "--pass-env", "MY_REGION", env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    unit = parse_unit(result.stdout).environment
    for secret in (*SECRETS, "custom-SECRET-000"):
        assert secret not in result.stdout + result.stderr
    assert unit["CLAUDE_CODE_OAUTH_TOKEN"] == "[redacted]"
    assert unit["MY_PROVIDER_KEY"] == "[redacted]"
    assert unit["MY_REGION"] == "[redacted]"  # a name it cannot judge is masked
    assert unit["HTTPS_PROXY"] == "http://[redacted]@proxy.example:3128"
    assert unit["ANTHROPIC_BASE_URL"] == "https://gateway.example/anthropic"
    assert unit["AWS_REGION"] == "eu-west-1"
    assert unit["PROHOST_SECRET_VARS"] == "MY_PROVIDER_KEY,MY_REGION"
    assert "[redacted]" in result.stderr  # says that the printed values are masked
    assert not (tmp_path / "user").exists()

    for name, says in (("UNSET_NAME", "not set"), ("PROHOST_TOKEN", "prohost's own"),
                       ("NOT-A-NAME", "variable's name")):
        refused = run_cli(tmp_path, *base, "--pass-env", name,
                          env={**env, "PROHOST_TOKEN": "t"}, cwd=ROOT)
        assert refused.returncode == 2
        last = refused.stderr.strip().splitlines()[-1]
        assert "--pass-env" in last and says in last, last


@pytest.mark.parametrize("login", ["oauth token", "subscription file"])
def test_an_api_key_beside_a_subscription_login_is_pointed_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], login: str
) -> None:
    env = install_env(tmp_path, ANTHROPIC_API_KEY="sk-ant-api-SECRET")
    if login == "oauth token":
        env["CLAUDE_CODE_OAUTH_TOKEN"] = OAUTH
    else:
        (tmp_path / "user/.claude").mkdir(parents=True)
        (tmp_path / "user/.claude/.credentials.json").write_text("{}")
    fake_program(tmp_path, "claude")
    options, spec = spec_for(env, tmp_path)
    assert install_daemon_command(options, print_only=True, env=env, platform="linux") == 0
    captured = capsys.readouterr()
    assert "claude -p uses the API key" in captured.err
    assert "sk-ant-api-SECRET" not in captured.out + captured.err
    assert systemd_unit(spec.shown()) == captured.out


async def test_the_harness_log_never_shows_a_passed_login(tmp_path: Path) -> None:
    """A real ``prohost agent run`` whose agent prints its keys as it fails: the
    harness logs the failure (stderr here, the journal under systemd), not the keys."""
    home = tmp_path / "home"
    command = "cat >/dev/null; echo \"refused: $ANTHROPIC_API_KEY $MY_PROVIDER_KEY\" >&2; exit 3"
    extra = {"ANTHROPIC_API_KEY": "sk-ant-api-LOGGED-SECRET",
             "MY_PROVIDER_KEY": "custom-LOGGED-SECRET", "PROHOST_SECRET_VARS": "MY_PROVIDER_KEY"}
    with trio.fail_after(60):
        async with running_server() as server:
            pair_home(server, home)
            async with harness_process(server, home, command, extra_env=extra) as harness:
                run_id = await server.submit_run("hello", conversation_id="C1")
                await server.wait_until(finished(run_id))
                await harness.wait_log("✗")  # the status line, once the panel polls
                harness.send_signal(signal.SIGTERM)
                assert await harness.wait_clean_exit() == 0
    assert any("✗" in line and "refused: " in line for line in harness.log), harness.log
    for line in harness.log:
        assert "LOGGED-SECRET" not in line, line
