"""``prohost agent install-daemon`` / ``uninstall-daemon``: the harness as a per-user service.

On Linux a systemd ``--user`` unit, on macOS a launchd LaunchAgent. Both run
``python -m prohost agent run`` with flags that reproduce the installing
command's :class:`~prohost.options.Options` exactly (:func:`harness_arguments`).

Why the installer is strict. A service manager restarts a process that exits
with an error, so a bad value copied into a unit does not print an error to
anyone: it becomes a restart every few seconds, for weeks, in a log nobody
reads. Everything the service will need is therefore checked here, while a
person is at the terminal: the flags (already parsed strictly), the agent
program on the PATH the service will get, ``--repos`` checkouts, the pairing,
and that the service's Python can import prohost at all. Whatever fails, fails
the install, before a file is written.

Why the service's environment is spelled out. A supervisor does not inherit the
installing shell: its PATH is minimal (``claude``/``codex``/``git`` are not on
it), its current directory is ``/`` or ``$HOME``, and ``$PROHOST_WS_URL`` is
unset. So the unit carries an absolute workdir, the shell's PATH, the API-key
variables the agent CLIs read, and ``--url`` for an URL that came from the
environment. It never carries the prohost token or secret: those stay in
``credentials.json`` (0600), which the harness reads itself.

Logging. The harness writes its own size-rotated ``$PROHOST_HOME/logs/agent.log``
(:mod:`prohost.logfile`), switched on by ``PROHOST_LOG=file`` in the service
environment. Stdout/stderr are left to the service manager (the journal on
Linux, a small file beside the log on macOS) and only catch what escapes
logging, like a traceback at start-up. ``StandardOutput=append:`` was the
alternative, and it cannot be rotated: the manager holds the file open forever.
"""

from __future__ import annotations

import hashlib
import math
import os
import plistlib
import pwd
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import attrs

from prohost.errors import last_line
from prohost.files import write_atomically
from prohost.home import (
    WORKSPACE_DIR,
    CredentialsError,
    InstanceLock,
    LockHeld,
    load_credentials,
)
from prohost.logfile import LOG_ENV, LOG_TO_FILE, log_path
from prohost.options import (
    DEFAULT_EXEC,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_LIMIT_WAIT_S,
    Options,
    default_machine_name,
)

INSTALL = "prohost agent install-daemon"
UNINSTALL = "prohost agent uninstall-daemon"

LABEL_PREFIX = "ai.prohost.agent"

#: How long the reporter keeps retrying a completion (prohost.reporter.DEFAULT_WINDOW_S).
#: Not imported: that would pull httpx into `--print`. tests/test_daemon.py checks they agree.
COMPLETION_RETRY_S = 600
#: Beyond the retry window: the ledger write, closing the socket, a last heartbeat.
DRAIN_SLACK_S = 60
MIN_STOP_TIMEOUT_S = 120
#: A stop (logout, reinstall, upgrade) waits at most this long for a drain. Past it the
#: service manager SIGKILLs the cgroup; the next harness finds the runs in its ledger,
#: kills their leftover agents and reports them, so nothing is silently lost.
MAX_STOP_TIMEOUT_S = 3600

#: Variables copied from the installing shell when set. PATH and HOME are always set.
PASSED_VARIABLES = (
    "HOME",
    "PATH",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "ANTHROPIC_API_KEY",
    "OPENAI_API_KEY",
    "CLAUDE_CONFIG_DIR",
    "CODEX_HOME",
)
#: Passed variables that are credentials: a unit holding one is written 0600, not 0644.
SECRET_VARIABLES = frozenset({"ANTHROPIC_API_KEY", "OPENAI_API_KEY"})

#: Options fields harness_arguments knows how to express ("home" travels as $PROHOST_HOME).
EXPRESSED_FIELDS = frozenset({
    "home", "exec_command", "url", "machine", "workdir", "timeout_s", "idle_timeout_s",
    "concurrency", "dry_run", "allow_unverified", "brain", "safe_tools", "repos",
    "accounts", "limit_wait_s",
})

#: Words after which the program is not the first word of --exec: not checkable here.
_SHELL_WORDS = frozenset({
    "env", "exec", "command", "nice", "nohup", "time", "sudo", "cd", "export", "source", ".",
    "eval", "set", "if", "for", "while", "until", "case", "{", "(", "!", "builtin",
})
_SHELL_SYNTAX = frozenset("$`()<>|;&*?[]{}~")


class DaemonError(Exception):
    """The service cannot be generated or installed; the message says why and what to do."""


# --- the `agent run` command line ---------------------------------------------------


def harness_arguments(options: Options) -> list[str]:
    """The ``agent run`` arguments that reproduce ``options``: only values that differ from
    the defaults, the workdir absolute.

    Parsed back with ``cli.build_parser()`` and ``options_from_args`` under
    ``PROHOST_HOME=options.home`` (the home is not a flag), they give an equal
    :class:`Options`. A field this function cannot express raises :class:`DaemonError`
    rather than being dropped: a service silently running without a flag the user
    gave is the failure this module exists to prevent.
    """
    _refuse_unknown_fields(options)
    args = ["agent", "run"]
    if options.exec_command != DEFAULT_EXEC:
        args += _flag("--exec", options.exec_command)
    if options.url is not None:
        # Also when it came from $PROHOST_WS_URL: the service does not get that variable.
        args += _flag("--url", options.url)
    if options.machine != default_machine_name():
        args += _flag("--machine", options.machine)
    if options.workdir != options.home / WORKSPACE_DIR:
        args += _flag("--workdir", str(options.workdir))
    if options.timeout_s != 0:
        args += _flag("--timeout", _seconds_text(options.timeout_s))
    if options.idle_timeout_s != DEFAULT_IDLE_TIMEOUT_S:
        args += _flag("--idle-timeout", _seconds_text(options.idle_timeout_s))
    if options.concurrency != 1:
        args += _flag("--concurrency", str(options.concurrency))
    if options.brain != "auto":
        args += _flag("--brain", options.brain)
    if options.safe_tools:
        args.append("--safe-tools")
    if options.dry_run:
        args.append("--dry-run")
    if options.allow_unverified:
        args.append("--allow-unverified")
    repos: Sequence[Path] = getattr(options, "repos", ())
    if repos:
        for repo in repos:
            # The flag splits on commas and strips each entry: such a path reads back
            # as another one.
            if "," in str(repo) or str(repo) != str(repo).strip():
                raise DaemonError(
                    f"--repos cannot name {str(repo)!r}: the flag separates checkouts with "
                    "commas and trims spaces; link the checkout to a plainer path"
                )
        args += _flag("--repos", ",".join(str(repo) for repo in repos))
    accounts: Sequence[tuple[str, Path]] = getattr(options, "accounts", ())
    for name, folder in accounts:
        # The flag's value is one NAME=DIR word; the name holds no "=", so the first
        # "=" splits it back; a folder that trims to another path would read back wrong.
        if str(folder) != str(folder).strip():
            raise DaemonError(
                f"--account {name} cannot name {str(folder)!r}: the flag trims spaces "
                "around the folder; link the folder to a plainer path"
            )
        args += _flag("--account", f"{name}={folder}")
    limit_wait_s: float = getattr(options, "limit_wait_s", DEFAULT_LIMIT_WAIT_S)
    if limit_wait_s != DEFAULT_LIMIT_WAIT_S:
        args += _flag("--limit-wait", _seconds_text(limit_wait_s))
    return args


def _flag(name: str, value: str) -> list[str]:
    # argparse reads a separate value that starts with "-" as another flag ("--exec -x"
    # fails); the joined form cannot be misread.
    return [f"{name}={value}"] if value.startswith("-") else [name, value]


def _seconds_text(seconds: float) -> str:
    """Plain decimal digits that parse_seconds reads back to exactly ``seconds``.

    repr() gives the shortest text that round-trips, but with an exponent for very
    small or large values ("1e-05"), which parse_seconds rightly refuses; the same
    decimal written out in full reads back to the same float.
    """
    return format(Decimal(repr(float(seconds))), "f")


def _refuse_unknown_fields(options: Options) -> None:
    for field in attrs.fields(type(options)):
        if field.name in EXPRESSED_FIELDS:
            continue
        default: Any = field.default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            default = default.factory(options) if default.takes_self else default.factory()
        if default is attrs.NOTHING or getattr(options, field.name) != default:
            raise DaemonError(
                f"this version of {INSTALL} cannot pass Options.{field.name} on to the "
                "service; it would run without it. Run `prohost agent run` directly instead"
            )


# --- the service --------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ServiceSpec:
    """What the service manager runs, independent of which manager it is."""

    label: str
    #: Absolute argv: ``[sys.executable, "-m", "prohost", "agent", "run", ...]``.
    program: list[str]
    working_directory: Path
    environment: dict[str, str]
    #: The harness's own rotating log (``$PROHOST_HOME/logs/agent.log``).
    log_path: Path
    #: Where launchd sends stdout/stderr (systemd sends them to the journal instead).
    stdio_path: Path
    stop_timeout_s: int


def service_label(home: Path) -> str:
    """``ai.prohost.agent.<8 hex>`` from the home, so that two homes are two services."""
    digest = hashlib.sha256(os.fsencode(home)).hexdigest()[:8]
    return f"{LABEL_PREFIX}.{digest}"


def stop_timeout_s(options: Options) -> int:
    """How long a stop may wait for the drain before the manager SIGKILLs everything.

    The first SIGTERM drains: runs in progress go on to finish (at most
    ``--timeout``), then their completion is retried for up to ten minutes.
    Without ``--timeout`` a run has no end, so the cap applies.
    """
    if options.timeout_s == 0:
        return MAX_STOP_TIMEOUT_S
    wanted = math.ceil(options.timeout_s) + COMPLETION_RETRY_S + DRAIN_SLACK_S
    return max(MIN_STOP_TIMEOUT_S, min(MAX_STOP_TIMEOUT_S, wanted))


def service_environment(options: Options, env: Mapping[str, str]) -> dict[str, str]:
    """The service's whole environment: an allow-list, so no PROHOST_TOKEN-like
    variable of the installing shell can reach the unit file."""
    passed = {name: env[name] for name in PASSED_VARIABLES if env.get(name)}
    passed.setdefault("PATH", os.defpath)
    passed.setdefault("HOME", str(_user_home(env)))
    passed["PROHOST_HOME"] = str(options.home)
    passed[LOG_ENV] = LOG_TO_FILE
    return passed


def service_spec(options: Options, env: Mapping[str, str]) -> ServiceSpec:
    """The service for ``options``, installed from a shell whose environment is ``env``.

    Pure: nothing is created (``--print`` touches nothing); the installer makes the
    workdir and the log folder.
    """
    if not sys.executable or not os.path.isabs(sys.executable):
        raise DaemonError("cannot tell which Python is running prohost (sys.executable is empty)")
    log = log_path(options.home)
    return ServiceSpec(
        label=service_label(options.home),
        program=[sys.executable, "-m", "prohost", *harness_arguments(options)],
        # Absolute already (Options checks it): the supervisor's own cwd is "/" or $HOME.
        working_directory=options.workdir,
        environment=service_environment(options, env),
        log_path=log,
        stdio_path=log.with_name("launchd.log"),
        stop_timeout_s=stop_timeout_s(options),
    )


# --- systemd ------------------------------------------------------------------------


def _systemd_word(word: str, *, in_exec: bool) -> str:
    """``word`` double-quoted per systemd.syntax(7), for ExecStart= or Environment=.

    ``%`` starts a specifier everywhere and ``$`` a variable in ExecStart=, so both
    are doubled; backslash, quote and control characters are C-escaped.
    """
    out = ['"']
    for char in word:
        if char in '\\"':
            out.append("\\" + char)
        elif char == "%":
            out.append("%%")
        elif char == "$" and in_exec:
            out.append("$$")
        elif char == "\n":
            out.append("\\n")
        elif char == "\t":
            out.append("\\t")
        elif ord(char) < 32 or ord(char) == 127:
            if char == "\0":
                raise DaemonError("a service argument cannot contain a NUL character")
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def _systemd_path(path: Path, what: str = "--workdir") -> str:
    """A path for a setting that takes it verbatim (WorkingDirectory=): no quoting there, so
    what cannot be written verbatim is refused rather than silently changed."""
    text = str(path)
    if any(ord(c) < 32 or ord(c) == 127 for c in text) or text != text.strip() or text.endswith(
        "\\"
    ):
        raise DaemonError(
            f"a systemd unit cannot name the directory {text!r} (control characters, or "
            f"white space or a backslash at an end); choose another {what}"
        )
    return text.replace("%", "%%")


def systemd_unit(spec: ServiceSpec) -> str:
    """A systemd ``--user`` unit for ``spec``."""
    env_lines = [
        f"Environment={_systemd_word(f'{name}={value}', in_exec=False)}"
        for name, value in spec.environment.items()
    ]
    minutes = math.ceil(spec.stop_timeout_s / 60)
    home = spec.environment.get("PROHOST_HOME", "")
    described = _systemd_path(Path(home), "$PROHOST_HOME") if home else spec.label
    lines = [
        f"# prohost agent harness, written by `{INSTALL}`: run it again to change the flags,",
        f"# `{UNINSTALL}` to remove it. Do not edit: the next install overwrites this file.",
        "[Unit]",
        f"Description=prohost agent ({described})",
        # No After=network-online.target: a user manager cannot order against system
        # targets, and the harness reconnects with backoff until the network is there.
        "",
        "[Service]",
        "Type=simple",
        "ExecStart=" + " ".join(_systemd_word(word, in_exec=True) for word in spec.program),
        f"WorkingDirectory={_systemd_path(spec.working_directory)}",
        *env_lines,
        "Restart=on-failure",
        "RestartSec=5",
        "# Stopping: the first SIGTERM drains. prohost accepts no new runs, lets the",
        "# running ones finish and retries reporting each result for up to 10 minutes,",
        f"# so a stop may take up to {minutes} minutes (TimeoutStopSec). To stop the runs",
        "# sooner, send a second SIGTERM to the main process only:",
        f"#   systemctl --user kill --kill-who=main --signal=SIGTERM {spec.label}.service",
        "# KillMode=mixed: SIGTERM goes to prohost alone (which stops its agent process",
        "# groups itself); at the timeout SIGKILL goes to the whole cgroup, agents included.",
        "# control-group would SIGTERM every agent at once and abort the runs a drain keeps.",
        "KillMode=mixed",
        "KillSignal=SIGTERM",
        f"TimeoutStopSec={spec.stop_timeout_s}",
        f"# prohost writes its own size-rotated log: {_comment(spec.log_path)};",
        "# stdout/stderr (start-up failures, tracebacks) go to the journal:",
        f"#   journalctl --user -u {spec.label}.service",
        "StandardOutput=journal",
        "StandardError=journal",
        "",
        "[Install]",
        "WantedBy=default.target",
        "",
    ]
    return "\n".join(lines)


def _comment(path: Path) -> str:
    return str(path).replace("\n", "?")


# --- launchd ------------------------------------------------------------------------


def launchd_plist(spec: ServiceSpec) -> str:
    """A LaunchAgent property list for ``spec``."""
    plist = {
        "Label": spec.label,
        "ProgramArguments": list(spec.program),
        "WorkingDirectory": str(spec.working_directory),
        "EnvironmentVariables": dict(spec.environment),
        "RunAtLoad": True,
        # Restart after a crash or a failed start, not after a clean exit (a finished drain).
        "KeepAlive": {"SuccessfulExit": False},
        # launchd's SIGTERM starts a drain like systemd's; SIGKILL after this many seconds.
        "ExitTimeOut": spec.stop_timeout_s,
        "StandardOutPath": str(spec.stdio_path),
        "StandardErrorPath": str(spec.stdio_path),
    }
    try:
        return plistlib.dumps(plist).decode("utf-8")
    except ValueError as exc:  # control characters have no XML 1.0 spelling
        raise DaemonError(f"a launchd plist cannot hold one of the values: {exc}") from None


# --- where, and which manager -------------------------------------------------------


def _user_home(env: Mapping[str, str]) -> Path:
    home = env.get("HOME")
    path = Path(home) if home else Path.home()
    if not path.is_absolute():
        raise DaemonError(
            f"$HOME must be an absolute path to place the service file (got {home!r})"
        )
    return path


def _manager(platform: str) -> str:
    if platform.startswith("linux"):
        return "systemd"
    if platform == "darwin":
        return "launchd"
    raise DaemonError(
        f"{INSTALL} knows systemd (Linux) and launchd (macOS), not {platform!r}; "
        "run `prohost agent run` under your own supervisor instead"
    )


def _unit_file(label: str, platform: str, env: Mapping[str, str]) -> Path:
    # ~/.config rather than $XDG_CONFIG_HOME: the user manager is started before any
    # shell profile, so it rarely sees the shell's XDG_CONFIG_HOME, and always searches this.
    if _manager(platform) == "systemd":
        return _user_home(env) / ".config" / "systemd" / "user" / f"{label}.service"
    return _user_home(env) / "Library" / "LaunchAgents" / f"{label}.plist"


def unit_path(spec: ServiceSpec, platform: str, env: Mapping[str, str]) -> Path:
    """``~/.config/systemd/user/<label>.service`` or ``~/Library/LaunchAgents/<label>.plist``."""
    return _unit_file(spec.label, platform, env)


def render(spec: ServiceSpec, platform: str) -> str:
    """The unit or plist text for ``platform``."""
    text = systemd_unit(spec) if _manager(platform) == "systemd" else launchd_plist(spec)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a path that is not valid UTF-8 (surrogate escapes)
        raise DaemonError("a value is not valid UTF-8 text, which a service file must be") from None
    return text


# --- checks before anything is written ----------------------------------------------


def _program_word(exec_command: str) -> str | None:
    """The program --exec runs, or None when it is a shell construct this cannot follow."""
    try:
        words = shlex.split(exec_command)
    except ValueError:
        return None
    for word in words:
        if "=" in word.split("/", 1)[0] and not word.startswith(("/", ".")):
            continue  # NAME=value before the command
        if word in _SHELL_WORDS or any(char in _SHELL_SYNTAX for char in word):
            return None
        return word
    return None


def check_exec(options: Options, service_path: str) -> str | None:
    """Why the agent program would not start under the service, or None.

    A failure, not a warning: the service would connect, accept every run and fail
    each one with "command not found" in the chat, far from the person who can fix it.
    """
    word = _program_word(options.exec_command)
    if word is None:
        return None  # a shell construct (`cd x && claude`): the shell decides; not guessed at
    if "/" in word:
        # The agent runs in the workdir, so that is where a relative path points.
        candidate = options.workdir / word
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return None
        return (
            f"--exec runs {word}, which is not an executable file"
            + ("" if word.startswith("/") else f" (taken from the workdir, {options.workdir})")
            + "; give its absolute path"
        )
    if shutil.which(word, path=service_path) is not None:
        return None
    return (
        f"--exec runs {word!r}, which is not on the PATH the service will get ({service_path}); "
        f"install it, give its absolute path in --exec, or run `{INSTALL}` from a shell "
        "whose PATH finds it"
    )


def check_repos(options: Options) -> list[str]:
    """``--repos`` entries that are not git checkouts (the daemon would serve runs without them)."""
    problems = []
    for repo in getattr(options, "repos", ()):
        if not (Path(repo) / ".git").exists():
            problems.append(f"--repos: {repo} is not a git checkout")
    return problems


def _check_workdir(options: Options) -> str | None:
    if options.workdir.exists() and not options.workdir.is_dir():
        return f"--workdir {options.workdir} exists and is not a directory"
    return None


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


# --- writing ------------------------------------------------------------------------


def _file_mode(spec: ServiceSpec) -> int:
    # 0644 is the usual mode for unit files, but not for one holding an API key:
    # ~/.config and ~/Library are often readable by other local users.
    return 0o600 if SECRET_VARIABLES & spec.environment.keys() else 0o644


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
) -> int:
    """``prohost agent install-daemon [agent run flags] [--print]``; returns the exit status.

    ``--print`` writes the unit or plist to stdout and touches nothing. Otherwise:
    check, write the file atomically, and start (or restart) the service. When the
    service manager is missing or refuses, the file stays written and the exact
    commands to run are printed, with exit status 1.
    """
    try:
        manager = _manager(platform)
        spec = service_spec(options, env)
        text = render(spec, platform)
        path = unit_path(spec, platform, env)
    except DaemonError as exc:
        _err(str(exc))
        return 1

    problems = [
        problem
        for problem in (_check_workdir(options), check_exec(options, spec.environment["PATH"]))
        if problem
    ]
    problems += check_repos(options)
    if problems:
        for problem in problems:
            _err(problem)
        print(f"nothing was {'printed' if print_only else 'installed'}.", file=sys.stderr)
        return 1

    if print_only:
        print(f"# {manager} file for {path}", file=sys.stderr)
        sys.stdout.write(text)
        return 0

    try:
        creds = load_credentials(options.home)
    except CredentialsError as exc:
        # The harness would exit 1 on this at every start: a restart loop, not a service.
        _err(f"{exc}; then run `{INSTALL}` again")
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
        write_atomically(path, text.encode("utf-8"), _file_mode(spec))
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
    print(f"  log:   {spec.log_path}")
    if manager == "systemd":
        print(f"  state: systemctl --user status {spec.label}")
        hint = _linger_hint(env)
        if hint:
            print(f"  note:  {hint}")
    else:
        print(f"  state: launchctl print gui/{os.getuid()}/{spec.label}")
    minutes = math.ceil(spec.stop_timeout_s / 60)
    print(f"  stop:  {UNINSTALL} (runs in progress finish first: up to {minutes} min)")


def uninstall_daemon_command(
    env: Mapping[str, str], home: Path, platform: str = sys.platform
) -> int:
    """``prohost agent uninstall-daemon``: stop (draining), disable and remove the service
    for ``home``. Nothing installed is not an error: it says so and exits 0."""
    try:
        manager = _manager(platform)
        label = service_label(home)
        path = _unit_file(label, platform, env)
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
