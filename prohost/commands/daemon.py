"""``prohost agent install-daemon`` / ``uninstall-daemon``: the harness as a per-user service.

On Linux a systemd ``--user`` unit, on macOS a launchd LaunchAgent. Both run
``python -m prohost agent run`` with flags that reproduce the installing
command's :class:`~prohost.options.Options` exactly (:mod:`prohost.commands.service`
renders the unit, this module checks, writes and starts it).

Why the installer is strict. A service manager restarts a process that exits
with an error, so a bad value copied into a unit does not print an error to
anyone: it becomes a restart every few seconds, for weeks, in a log nobody
reads. Everything the service will need is therefore checked here, while a
person is at the terminal: the flags (already parsed strictly), the agent
program on the PATH the service will get, ``--repos`` checkouts, the pairing,
and that the service's Python can import prohost at all. Whatever fails, fails
the install, before a file is written.

Logging. The harness writes its own size-rotated ``$PROHOST_HOME/logs/agent.log``
(:mod:`prohost.logfile`), switched on by ``PROHOST_LOG=file`` in the service
environment. Stdout/stderr are left to the service manager (the journal on
Linux, a small file beside the log on macOS) and only catch what escapes
logging, like a traceback at start-up. ``StandardOutput=append:`` was the
alternative, and it cannot be rotated: the manager holds the file open forever.
"""

from __future__ import annotations

import math
import os
import pwd
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from prohost.commands.service import (
    INSTALL,
    MAX_STOP_TIMEOUT_S,
    UNINSTALL,
    DaemonError,
    ServiceSpec,
    render,
    service_label,
    service_manager,
    service_spec,
    unit_file,
    unit_path,
)
from prohost.errors import last_line
from prohost.files import write_atomically
from prohost.home import CredentialsError, InstanceLock, LockHeld, load_credentials
from prohost.invocation import command
from prohost.login_env import carried, login_notes, subscription_login
from prohost.options import Options
from prohost.startchecks import start_problems

# --- checks before anything is written ----------------------------------------------


def _check_python(spec: ServiceSpec) -> str | None:
    """Whether the service's own command can start, from its own directory and environment.

    ``python -m prohost`` from a source tree works only in that tree; the service runs
    elsewhere. Running the exact program with ``--version`` is the one honest check.
    """
    argv = [*spec.program[:3], "--version"]
    try:
        result = subprocess.run(
            argv, cwd=spec.working_directory, env=spec.environment, stdin=subprocess.DEVNULL,
            capture_output=True, timeout=60, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the service could not run {shlex.join(argv)}: {exc}"
    if result.returncode != 0:
        detail = last_line(result.stderr) or f"exit status {result.returncode}"
        return (
            f"the service could not run {shlex.join(argv)} from {spec.working_directory}: "
            f"{detail}; install prohost into that Python (pip install prohost) first"
        )
    return None


# --- running the manager ------------------------------------------------------------


@attrs.frozen
class _Ran:
    ok: bool
    detail: str


def _run(tool: str, args: Sequence[str], env: Mapping[str, str], timeout: float) -> _Ran:
    try:
        result = subprocess.run(
            [tool, *args], env=dict(env), stdin=subprocess.DEVNULL, capture_output=True,
            timeout=timeout, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return _Ran(False, str(exc))
    detail = last_line(result.stderr) or last_line(result.stdout)
    return _Ran(result.returncode == 0, detail or f"exit status {result.returncode}")


def _err(message: str, prog: str = INSTALL) -> None:
    print(f"{prog}: error: {message}", file=sys.stderr)


def _linger_hint(env: Mapping[str, str]) -> str | None:
    """systemd stops a user's services at their last logout unless lingering is on."""
    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        user = env.get("USER", "")
    if not user or Path("/var/lib/systemd/linger", user).exists():
        return None
    return (
        "systemd stops this service when you log out of your last session; to keep it "
        f"running: loginctl enable-linger {user}"
    )


def install_daemon_command(
    options: Options,
    *,
    print_only: bool,
    env: Mapping[str, str],
    platform: str = sys.platform,
    pass_env: Sequence[str] = (),
) -> int:
    """``prohost agent install-daemon [agent run flags] [--pass-env NAME]... [--print]``;
    returns the exit status. ``pass_env``: names already checked to be set in ``env``.

    ``--print`` writes the unit or plist, secrets masked, to stdout and touches nothing. Otherwise:
    check, write the file atomically, and start (or restart) the service. When the
    service manager is missing or refuses, the file stays written and the exact
    commands to run are printed, with exit status 1.
    """
    try:
        manager = service_manager(platform)
        spec = service_spec(options, env, pass_env)
        text = render(spec, platform)
        shown = render(spec.shown(), platform)
        path = unit_path(spec, platform, env)
    except DaemonError as exc:
        _err(str(exc))
        return 1

    # The same checks as `agent run` (prohost.startchecks), against the PATH the
    # service will get; exit 2 like any other bad flag.
    problems = start_problems(options, spec.environment["PATH"],
                              "the PATH the service will get")
    if problems:
        for problem in problems:
            _err(problem)
        print(f"nothing was {'printed' if print_only else 'installed'}.", file=sys.stderr)
        return 2

    for note in login_notes(spec.environment, env, subscription_login=subscription_login(env)):
        print(f"note: {note}", file=sys.stderr)
    if print_only:
        masked = " (secret values shown as [redacted])" if shown != text else ""
        print(f"# {manager} file for {path}{masked}", file=sys.stderr)
        sys.stdout.write(shown)
        return 0

    try:
        creds = load_credentials(options.home)
    except CredentialsError as exc:
        # The harness would exit 1 on this at every start: a restart loop, not a service.
        _err(f"{exc}; then run `{command('agent', 'install-daemon')}` again")
        return 1
    if creds.token in text or creds.secret in text:
        _err("the prohost token or secret appears in the service's flags or environment; "
             "refusing to write it into a service file")
        return 1

    installed_before = path.exists()
    if not installed_before:
        _warn_if_home_in_use(options.home)
    try:
        options.workdir.mkdir(parents=True, exist_ok=True)
        spec.log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        _err(f"cannot create {exc.filename}: {exc.strerror}")
        return 1
    unstartable = _check_python(spec)
    if unstartable:
        _err(unstartable)
        print("nothing was installed.", file=sys.stderr)
        return 1
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, text.encode("utf-8"), 0o600 if spec.holds_secrets() else 0o644)
    except OSError as exc:
        _err(f"cannot write {path}: {exc.strerror or exc}")
        return 1

    if manager == "systemd":
        code = _start_systemd(spec, path, env, installed_before)
    else:
        code = _start_launchd(spec, path, env, installed_before)
    if code == 0:
        _print_installed(spec, path, manager, env, installed_before)
    return code


def _warn_if_home_in_use(home: Path) -> None:
    try:
        InstanceLock.acquire(home).release()
    except LockHeld as exc:
        who = f"pid {exc.pid}" if exc.pid else "another process"
        print(
            f"warning: {who} is already running an agent with PROHOST_HOME={home}; the "
            "service keeps restarting until it stops",
            file=sys.stderr,
        )
    except OSError:
        pass  # the harness will say what is wrong with the home; this is only a hint


def _start_systemd(
    spec: ServiceSpec, path: Path, env: Mapping[str, str], installed_before: bool
) -> int:
    unit = f"{spec.label}.service"
    if installed_before:
        # `enable --now` would leave the running service on its old flags. --no-block:
        # the old harness drains first, which may take minutes; nobody should wait for it.
        steps = [["daemon-reload"], ["enable", unit], ["restart", "--no-block", unit]]
    else:
        steps = [["daemon-reload"], ["enable", "--now", unit]]
    manual = " && ".join(shlex.join(["systemctl", "--user", *step]) for step in steps)
    systemctl = shutil.which("systemctl", path=env.get("PATH", os.defpath))
    if systemctl is None:
        _err(f"wrote {path}, but systemctl is not on PATH, so the service is not running. "
             f"Start it with: {manual}")
        return 1
    for step in steps:
        ran = _run(systemctl, ["--user", *step], env, timeout=120)
        if not ran.ok:
            _err(f"wrote {path}, but `systemctl --user {shlex.join(step)}` failed "
                 f"({ran.detail}). Start it with: {manual}")
            return 1
    return 0


def _start_launchd(
    spec: ServiceSpec, path: Path, env: Mapping[str, str], installed_before: bool
) -> int:
    domain = f"gui/{os.getuid()}"
    target = f"{domain}/{spec.label}"
    launchctl = shutil.which("launchctl", path=env.get("PATH", os.defpath))
    steps = [["enable", target], ["bootstrap", domain, str(path)]]
    manual = " && ".join(shlex.join(["launchctl", *step]) for step in steps)
    if launchctl is None:
        _err(f"wrote {path}, but launchctl is not on PATH, so the agent is not running. "
             f"Start it with: {manual}")
        return 1
    if installed_before:
        # bootstrap refuses a label that is loaded; the old harness drains on bootout's
        # SIGTERM (bootout waits for it). Failing here means it was not loaded.
        # Said first: the wait can be as long as the drain, with nothing else on screen.
        print(f"stopping the running harness ({spec.label}): it finishes its runs first, "
              f"up to {_duration(spec.stop_timeout_s)}...", flush=True)
        _run(launchctl, ["bootout", target], env, timeout=spec.stop_timeout_s + 30)
    for step in steps:
        ran = _run(launchctl, step, env, timeout=120)
        if not ran.ok:
            _err(f"wrote {path}, but `launchctl {shlex.join(step)}` failed ({ran.detail}). "
                 f"Start it with: {manual}")
            return 1
    return 0


def _print_installed(
    spec: ServiceSpec, path: Path, manager: str, env: Mapping[str, str], replaced: bool
) -> None:
    if replaced:
        print(f"updated {spec.label}: {path}; it restarts once the old harness has drained")
    else:
        print(f"installed and started {spec.label}: {path}")
    print(f"  runs:  {shlex.join(spec.program)}")
    logins = [name for name in spec.environment if name in carried(env) or name in spec.passed]
    if logins:  # named, never their values: the person should know what the file holds
        private = " (secrets in this file only, mode 0600)" if spec.holds_secrets() else ""
        print(f"  env:   {', '.join(logins)} from this shell{private}")
    print(f"  log:   {spec.log_path}")
    if manager == "systemd":
        print(f"  state: systemctl --user status {spec.label}")
        hint = _linger_hint(env)
        if hint:
            print(f"  note:  {hint}")
    else:
        print(f"  state: launchctl print gui/{os.getuid()}/{spec.label}")
    print(f"  stop:  {command('agent', 'uninstall-daemon')} (runs in progress finish first: up to "
          f"{_duration(spec.stop_timeout_s)})")


def _duration(seconds: int) -> str:
    return f"{math.ceil(seconds / 60)} min"


def uninstall_daemon_command(
    env: Mapping[str, str], home: Path, platform: str = sys.platform
) -> int:
    """``prohost agent uninstall-daemon``: stop (draining), disable and remove the service
    for ``home``. Nothing installed is not an error: it says so and exits 0."""
    try:
        manager = service_manager(platform)
        label = service_label(home)
        path = unit_file(label, platform, env)
    except DaemonError as exc:
        _err(str(exc), UNINSTALL)
        return 1
    if not path.exists():
        print(f"no prohost service is installed for PROHOST_HOME={home} (no {path}); "
              "nothing to do")
        return 0
    if manager == "systemd":
        code = _stop_systemd(label, path, env)
    else:
        code = _stop_launchd(label, path, env)
    if code == 0:
        print(f"removed {label}: {path}")
    return code


def _stop_systemd(label: str, path: Path, env: Mapping[str, str]) -> int:
    unit = f"{label}.service"
    systemctl = shutil.which("systemctl", path=env.get("PATH", os.defpath))
    if systemctl is None:
        # No systemctl here, so nothing here can be running it: remove the file and the
        # enablement link, which would otherwise dangle.
        path.unlink(missing_ok=True)
        (path.parent / "default.target.wants" / unit).unlink(missing_ok=True)
        print(f"systemctl is not on PATH; removed {path}. If the service is still running, "
              f"stop it with: systemctl --user disable --now {unit}", file=sys.stderr)
        return 0
    print(f"stopping {unit}: runs in progress finish and report first, which can take "
          "minutes...", flush=True)
    # Blocks through the drain on purpose: the command returns once the runs are done.
    ran = _run(
        systemctl, ["--user", "disable", "--now", unit], env, timeout=MAX_STOP_TIMEOUT_S + 60
    )
    if not ran.ok:
        # Kept: removing the file of a service systemd still runs would orphan it.
        _err(f"`systemctl --user disable --now {unit}` failed ({ran.detail}); {path} is left "
             f"in place. Run it yourself, then: rm {shlex.quote(str(path))} && "
             "systemctl --user daemon-reload", UNINSTALL)
        return 1
    path.unlink(missing_ok=True)
    ran = _run(systemctl, ["--user", "daemon-reload"], env, timeout=120)
    if not ran.ok:
        print(f"removed {path}; `systemctl --user daemon-reload` failed ({ran.detail})",
              file=sys.stderr)
    return 0


def _stop_launchd(label: str, path: Path, env: Mapping[str, str]) -> int:
    target = f"gui/{os.getuid()}/{label}"
    launchctl = shutil.which("launchctl", path=env.get("PATH", os.defpath))
    if launchctl is not None:
        print(f"stopping {label}: runs in progress finish and report first...", flush=True)
        ran = _run(launchctl, ["bootout", target], env, timeout=MAX_STOP_TIMEOUT_S + 60)
        if not ran.ok:
            # Usually "not loaded"; either way, without the plist it will not start again.
            print(f"`launchctl bootout {target}`: {ran.detail}", file=sys.stderr)
    path.unlink(missing_ok=True)
    return 0
