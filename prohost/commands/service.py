"""What the per-user service is, as text: the ``agent run`` command line that
reproduces an :class:`~prohost.options.Options` exactly (:func:`harness_arguments`),
the systemd ``--user`` unit, the launchd plist, and where each goes. Pure: nothing
here writes a file or runs a program (that is :mod:`prohost.commands.daemon`).

Why the service's environment is spelled out. A supervisor does not inherit the
installing shell: its PATH is minimal (``claude``/``codex``/``git`` are not on
it), its current directory is ``/`` or ``$HOME``, and ``$PROHOST_WS_URL`` is
unset. So the unit carries an absolute workdir, the shell's PATH, the login and
endpoint variables the agent CLIs read (:mod:`prohost.login_env`, plus any
``--pass-env NAME``), and ``--url`` for an URL that came from the environment. It
never carries the prohost token or secret: those stay in ``credentials.json``
(0600), which the harness reads itself.

Where the login secrets go: inline in the one unit or plist, written 0600 when it
holds one. launchd has no separate environment file, so an ``EnvironmentFile=``
would give systemd a second file to create, keep private and remove, and leave the
plist as it is; one private file per service is the same on both and cannot
drift apart. Only the same user can read it, or ask their own user manager for it.
"""

from __future__ import annotations

import hashlib
import math
import os
import plistlib
import sys
from collections.abc import Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import attrs

from prohost.home import (
    WORKSPACE_DIR,
)
from prohost.invocation import command
from prohost.logfile import LOG_ENV, LOG_TO_FILE, log_path
from prohost.login_env import SECRET_VARS_ENV, carried, masked
from prohost.options import (
    DEFAULT_EXEC,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_LIMIT_WAIT_S,
    Options,
    default_machine_name,
)
from prohost.wire.intake import MAX_QUEUED_RUNS

INSTALL = "prohost agent install-daemon"
UNINSTALL = "prohost agent uninstall-daemon"

LABEL_PREFIX = "ai.prohost.agent"

#: How long the reporter keeps retrying a completion
#: (prohost.engine.report.reporter.DEFAULT_WINDOW_S).
#: Not imported: that would pull httpx into `--print`.
#: tests/commands/test_install_daemon.py checks they agree.
COMPLETION_RETRY_S = 600
#: Beyond the retry window: the ledger write, closing the socket, a last heartbeat.
DRAIN_SLACK_S = 60
MIN_STOP_TIMEOUT_S = 120
#: A stop (logout, reinstall, upgrade) waits at most this long for a drain. Past it the
#: service manager SIGKILLs the cgroup; the next harness finds the runs in its ledger,
#: kills their leftover agents and reports them, so nothing is silently lost.
MAX_STOP_TIMEOUT_S = 3600

#: Variables copied from the installing shell when set, besides the agent CLIs'
#: logins (:func:`prohost.login_env.carried`). PATH and HOME are always set.
PASSED_VARIABLES = ("HOME", "PATH", "LANG", "LC_ALL", "LC_CTYPE")

#: Options fields harness_arguments knows how to express ("home" travels as $PROHOST_HOME).
EXPRESSED_FIELDS = frozenset({
    "home", "exec_command", "url", "machine", "workdir", "timeout_s", "idle_timeout_s",
    "concurrency", "dry_run", "allow_unverified", "brain", "safe_tools", "repos",
    "accounts", "limit_wait_s", "max_queued", "max_cost_usd", "sandbox", "allow_write",
    "allow_read", "acp_model", "acp_mode",
})



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
    max_queued: int = getattr(options, "max_queued", MAX_QUEUED_RUNS)
    if max_queued != MAX_QUEUED_RUNS:
        args += _flag("--max-queued", str(max_queued))
    max_cost_usd: float | None = getattr(options, "max_cost_usd", None)
    if max_cost_usd is not None:
        # Four decimals read back to the same float as parse_max_cost made of them.
        args += _flag("--max-cost", f"{max_cost_usd:.4f}".rstrip("0").rstrip("."))
    for flag, chosen in (("--acp-model", getattr(options, "acp_model", ())),
                         ("--acp-mode", getattr(options, "acp_mode", ()))):
        for account, value in chosen:
            args += _flag(flag, f"{account}={value}" if account else value)
    sandbox: str = getattr(options, "sandbox", "auto")
    if sandbox != "auto":
        args += _flag("--sandbox", sandbox)
    for flag, paths in (("--allow-write", getattr(options, "allow_write", ())),
                        ("--allow-read", getattr(options, "allow_read", ()))):
        for path in paths:
            # The flag strips its value; a path that trims to another reads back wrong.
            if str(path) != str(path).strip():
                raise DaemonError(f"{flag} cannot name {str(path)!r}: the flag trims spaces; "
                                  "link it to a plainer path")
            args += _flag(flag, str(path))
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
                f"service; it would run without it. Run `{command('agent', 'run')}` directly "
                "instead"
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
    #: Names given with ``--pass-env``: their values are masked like secrets.
    passed: tuple[str, ...] = ()

    def shown(self) -> ServiceSpec:
        """This spec with every secret value masked (``--print``, the install's output)."""
        return attrs.evolve(self, environment={
            name: masked(name, value, secret=name in self.passed)
            for name, value in self.environment.items()
        })

    def holds_secrets(self) -> bool:
        """Whether a value is a credential: the file is then 0600, not the usual 0644
        (~/.config and ~/Library are often readable by other local users)."""
        return self.shown().environment != self.environment


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


def service_environment(
    options: Options, env: Mapping[str, str], pass_env: Sequence[str] = ()
) -> dict[str, str]:
    """The service's whole environment: an allow-list (and ``pass_env``, names the
    user chose), so no PROHOST_TOKEN-like variable of the installing shell can reach
    the unit file."""
    passed = {name: env[name] for name in PASSED_VARIABLES if env.get(name)}
    passed.setdefault("PATH", os.defpath)
    passed.setdefault("HOME", str(_user_home(env)))
    passed.update(carried(env))
    passed.update({name: env[name] for name in pass_env})
    passed["PROHOST_HOME"] = str(options.home)
    passed[LOG_ENV] = LOG_TO_FILE
    if pass_env:
        # So that the harness keeps their values out of its log too.
        passed[SECRET_VARS_ENV] = ",".join(pass_env)
    return passed


def service_spec(
    options: Options, env: Mapping[str, str], pass_env: Sequence[str] = ()
) -> ServiceSpec:
    """The service for ``options``, installed from a shell whose environment is ``env``,
    also passing the variables named in ``pass_env`` (checked: set in ``env``).

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
        environment=service_environment(options, env, pass_env),
        log_path=log,
        stdio_path=log.with_name("launchd.log"),
        stop_timeout_s=stop_timeout_s(options),
        passed=tuple(pass_env),
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


def service_manager(platform: str) -> str:
    if platform.startswith("linux"):
        return "systemd"
    if platform == "darwin":
        return "launchd"
    raise DaemonError(
        f"{INSTALL} knows systemd (Linux) and launchd (macOS), not {platform!r}; "
        f"run `{command('agent', 'run')}` under your own supervisor instead"
    )


def unit_file(label: str, platform: str, env: Mapping[str, str]) -> Path:
    # ~/.config rather than $XDG_CONFIG_HOME: the user manager is started before any
    # shell profile, so it rarely sees the shell's XDG_CONFIG_HOME, and always searches this.
    if service_manager(platform) == "systemd":
        return _user_home(env) / ".config" / "systemd" / "user" / f"{label}.service"
    return _user_home(env) / "Library" / "LaunchAgents" / f"{label}.plist"


def unit_path(spec: ServiceSpec, platform: str, env: Mapping[str, str]) -> Path:
    """``~/.config/systemd/user/<label>.service`` or ``~/Library/LaunchAgents/<label>.plist``."""
    return unit_file(spec.label, platform, env)


def render(spec: ServiceSpec, platform: str) -> str:
    """The unit or plist text for ``platform``."""
    text = systemd_unit(spec) if service_manager(platform) == "systemd" else launchd_plist(spec)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a path that is not valid UTF-8 (surrogate escapes)
        raise DaemonError("a value is not valid UTF-8 text, which a service file must be") from None
    return text
