"""``prohost agent run`` flags, parsed strictly into one frozen :class:`Options`.

Strict because every lenient reading here has a cost that shows up much later and
far away: ``--concurrency`` with its value forgotten, read as "absent", leaves
someone believing four runs go at once while one does; ``--timeout -5`` read as
"no timeout" lets a stuck agent hold a slot forever. So a value that is not
exactly one of the accepted forms is an :class:`OptionError`, reported before
anything connects or touches a file.

Nothing here does I/O: :func:`options_from_args` takes the environment and the
current directory as arguments, so it is a plain function of its inputs.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from prohost.execline import shell_tail_problem
from prohost.home import WORKSPACE_DIR, http_base_from_ws, prohost_home
from prohost.repospec import ReposFlagError, parse_repos
from prohost.wire.intake import MAX_QUEUED_RUNS

MAX_CONCURRENCY = 16
DEFAULT_EXEC = "claude -p"
DEFAULT_IDLE_TIMEOUT_S = 900.0
MAX_MACHINE_LEN = 128
#: How long a queued run waits for an account's usage limit to reset before it is
#: reported retryable (seconds; docs/protocol.md §12's default of 15 minutes).
DEFAULT_LIMIT_WAIT_S = 900.0
#: --brain: the agent CLIs prohost can drive (auto: chosen from --exec's program). The
#: one list: prohost.engine.agent.brains imports it (this room is below the engine's).
BRAIN_CHOICES = ("auto", "acp", "claude", "codex", "plain")
#: --sandbox: confine every agent where the OS can (auto), refuse to start where it
#: cannot (required), or never (off). docs/protocol.md §13.
SANDBOX_CHOICES = ("auto", "required", "off")

CONCURRENCY_RANGE = f"a whole number from 1 to {MAX_CONCURRENCY}"
DURATION_RANGE = (
    "a duration of 0 or more: seconds, or a number with s, m or h (e.g. 600, 90s, 15m, 2h)"
)

MAX_QUEUED_RANGE = f"a whole number from 1 to {MAX_QUEUED_RUNS}"

VALUE_DESCRIPTIONS: dict[str, str] = {
    "--exec": "a shell command line that starts the agent, e.g. --exec 'claude -p'",
    "--url": "a ws:// or wss:// URL of the server's agent socket",
    "--machine": f"a name for this machine, 1 to {MAX_MACHINE_LEN} characters",
    "--workdir": "a directory for the agent to work in",
    "--timeout": DURATION_RANGE,
    "--idle-timeout": DURATION_RANGE,
    "--concurrency": CONCURRENCY_RANGE,
    "--brain": f"one of {', '.join(BRAIN_CHOICES)}",
    "--repos": "a comma-separated list of git checkouts, e.g. --repos ~/code/app",
    "--account": "NAME=DIR: an account name and the agent's config folder, "
                 "e.g. --account work=~/.claude-work",
    "--limit-wait": DURATION_RANGE,
    "--max-queued": MAX_QUEUED_RANGE,
    "--sandbox": "one of auto, required, off",
    "--allow-write": "an existing file or folder a confined agent may also write, "
                     "e.g. --allow-write ~/.m2",
    "--allow-read": "an existing file or folder a confined agent may also read, "
                    "e.g. --allow-read ~/.ssh",
}
"""What each ``agent run`` value flag accepts, for "this flag needs a value" errors."""


#: The largest --max-cost accepted (US dollars): a budget, not a way to say "none".
MAX_COST_USD = 10_000.0
MAX_COST_RANGE = "a dollar amount above 0 and at most 10000, e.g. --max-cost 2.50"
_MONEY = re.compile(r"\$?(?:[0-9]{1,5}(?:\.[0-9]{1,4})?|\.[0-9]{1,4})")


class OptionError(ValueError):
    """A flag's value is unusable. The message is one line naming the flag and what it accepts."""


_DURATION = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?P<unit>[smh]?)")
_UNIT_SECONDS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_seconds(flag: str, raw: str) -> float:
    """A duration in seconds from ``600``, ``90s``, ``1.5m``, ``15m`` or ``2h``; 0 is allowed.

    No sign, no exponent, no ``nan``/``inf``: the pattern only admits plain decimal
    digits, and a result too large to be finite is refused as well.
    """
    match = _DURATION.fullmatch(raw.strip())
    seconds = math.nan
    if match:
        seconds = float(match["number"]) * _UNIT_SECONDS[match["unit"]]
    if not math.isfinite(seconds):
        raise OptionError(f"{flag} must be {DURATION_RANGE}; got {raw!r}")
    return seconds


#: The most digits a count without an upper bound may have (``--lines``): beyond
#: it nothing is a sensible count, and Python refuses ``int()`` of over 4,300
#: digits with a ValueError (a traceback where a usage error belongs).
MAX_COUNT_DIGITS = 18


def whole_number(raw: str, low: int, high: int | None = None) -> int | None:
    """``raw`` (spaces around it allowed) as a whole number from ``low`` to ``high``
    (``None``: up to :data:`MAX_COUNT_DIGITS` digits), or ``None`` when it is not
    one. ASCII digits only: ``isdigit()`` alone admits "²" and "٤", which ``int()``
    then refuses or reads as something else. The one count parser of every flag."""
    digits = raw.strip()
    if not (digits.isascii() and digits.isdigit()):
        return None
    significant = digits.lstrip("0") or "0"
    if len(significant) > (MAX_COUNT_DIGITS if high is None else len(str(high))):
        return None  # more digits than the bound has: never int() of them
    value = int(significant)
    return value if value >= low and (high is None or value <= high) else None


def parse_concurrency(raw: str) -> int:
    """How many runs may execute at once: ASCII digits only, 1 to :data:`MAX_CONCURRENCY`."""
    count = whole_number(raw, 1, MAX_CONCURRENCY)
    if count is None:
        raise OptionError(f"--concurrency must be {CONCURRENCY_RANGE} (got {raw!r})")
    return count


def parse_max_queued(raw: str) -> int:
    """``--max-queued``: ASCII digits only, 1 to :data:`MAX_QUEUED_RUNS`."""
    count = whole_number(raw, 1, MAX_QUEUED_RUNS)
    if count is None:
        raise OptionError(f"--max-queued must be {MAX_QUEUED_RANGE} (got {raw!r})")
    return count


def default_machine_name() -> str:
    """The host name, which is what the web app shows until the user picks another."""
    return socket.gethostname() or "prohost-agent"


def _check_seconds(_: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{attribute.name} must be a finite number of seconds >= 0, got {value}")


def _check_concurrency(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not 1 <= value <= MAX_CONCURRENCY:
        raise ValueError(f"{attribute.name} must be from 1 to {MAX_CONCURRENCY}, got {value}")


def _check_absolute(_: object, attribute: attrs.Attribute[Path], value: Path) -> None:
    if not value.is_absolute():
        raise ValueError(f"{attribute.name} must be an absolute path, got {value}")


@attrs.frozen(kw_only=True)
class Options:
    """Everything ``prohost agent run`` was asked to do, checked and made absolute.

    The validators are a second line of defence for code that builds Options
    directly (tests, the daemon installer); the CLI's own checks in
    :func:`options_from_args` give the user-facing messages.
    """

    home: Path = attrs.field(validator=_check_absolute)
    exec_command: str = DEFAULT_EXEC
    url: str | None = None
    machine: str = attrs.field(factory=default_machine_name)
    workdir: Path = attrs.field(
        default=attrs.Factory(lambda self: self.home / WORKSPACE_DIR, takes_self=True),
        validator=_check_absolute,
    )
    timeout_s: float = attrs.field(default=0.0, validator=_check_seconds)
    idle_timeout_s: float = attrs.field(default=DEFAULT_IDLE_TIMEOUT_S, validator=_check_seconds)
    concurrency: int = attrs.field(default=1, validator=_check_concurrency)
    dry_run: bool = False
    allow_unverified: bool = False
    #: How the agent CLI is driven: auto (from the --exec program), claude, codex, plain.
    brain: str = attrs.field(default="auto", validator=attrs.validators.in_(BRAIN_CHOICES))
    #: Leave the CLI's permission prompts on (no flag that lets it run unattended).
    safe_tools: bool = False
    #: --repos: absolute checkouts each conversation gets a private worktree of.
    repos: tuple[Path, ...] = ()
    #: --account NAME=DIR, in the order given: the agent CLI's logins (docs/protocol.md
    #: §12). Empty: the one implicit ``default`` account, environment unchanged.
    accounts: tuple[tuple[str, Path], ...] = ()
    #: --limit-wait: how long a queued run waits for a usage limit to reset (s).
    limit_wait_s: float = attrs.field(default=DEFAULT_LIMIT_WAIT_S, validator=_check_seconds)
    #: --max-queued: at this many queued runs new deliveries get 503 "queue full" (§3).
    max_queued: int = attrs.field(
        default=MAX_QUEUED_RUNS,
        validator=[attrs.validators.ge(1), attrs.validators.le(MAX_QUEUED_RUNS)],
    )
    #: --max-cost: what one run may spend, in US dollars (§12); None: no budget.
    max_cost_usd: float | None = attrs.field(default=None, validator=attrs.validators.optional(
        [attrs.validators.gt(0.0), attrs.validators.le(MAX_COST_USD)]))
    #: --sandbox: auto, required or off (docs/protocol.md §13).
    sandbox: str = attrs.field(default="auto", validator=attrs.validators.in_(SANDBOX_CHOICES))
    #: --allow-write PATH, in the order given: absolute, existing; a confined run may
    #: write each (and read it).
    allow_write: tuple[Path, ...] = ()
    #: --allow-read PATH: absolute, existing; a confined run may read each, even
    #: where it would be hidden (``~/.ssh`` for pushing over SSH).
    allow_read: tuple[Path, ...] = ()
    #: --acp-model / --acp-mode [ACCOUNT=]VALUE: what an ACP session is given once
    #: open, per account ("" for every account), in the order given.
    acp_model: tuple[tuple[str, str], ...] = ()
    acp_mode: tuple[tuple[str, str], ...] = ()


def check_url(flag: str, raw: str) -> str:
    """A ws/wss URL with a host, else :class:`OptionError` naming ``flag``."""
    try:
        http_base_from_ws(raw)
    except ValueError as exc:
        raise OptionError(
            f"{flag} must be a ws:// or wss:// URL with a host, "
            f"e.g. ws://127.0.0.1:8765/v1/agent/ws ({exc})"
        ) from None
    return raw.strip()


def check_machine(raw: str) -> str:
    """A machine name fit for an HTTP header: the server shows it, so it must be one clean line."""
    name = raw.strip()
    if not name or len(name) > MAX_MACHINE_LEN or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise OptionError(
            f"--machine must be a name of 1 to {MAX_MACHINE_LEN} characters "
            f"without control characters (got {raw!r})"
        )
    return name


def _expand_path(raw: str, env: Mapping[str, str], cwd: Path) -> Path:
    # `--workdir=~/code` reaches us unexpanded (the shell only expands a leading ~).
    if raw == "~" or raw.startswith("~/"):
        home = env.get("HOME")
        base = Path(home) if home else Path.home()
        path = base / raw[2:] if raw != "~" else base
    else:
        path = Path(raw)
    # Absolute now: the agent runs in another directory, and a daemon has no cwd of ours.
    return Path(os.path.normpath(cwd / path))


def options_from_args(
    ns: argparse.Namespace,
    env: Mapping[str, str],
    cwd: Path,
    *,
    require_checkouts: bool = False,
) -> Options:
    """Turn parsed ``agent run`` arguments into :class:`Options`, or raise :class:`OptionError`.

    ``ns`` attributes (absent ones take their defaults): ``exec_command``, ``url``,
    ``machine``, ``workdir``, ``timeout``, ``idle_timeout``, ``concurrency`` (all
    strings or None), ``dry_run``, ``allow_unverified`` (bools), ``accounts`` and
    ``repos`` (lists of the repeated flag's values, or None), ``limit_wait``,
    ``max_queued`` (strings or None).
    """
    home = prohost_home(env, cwd)

    exec_command = getattr(ns, "exec_command", None)
    if exec_command is None:
        exec_command = DEFAULT_EXEC
    elif not exec_command.strip():
        raise OptionError(
            "--exec must be a shell command line that starts the agent, "
            "e.g. --exec 'claude -p' (got an empty one)"
        )

    url: str | None = None
    raw_url = getattr(ns, "url", None)
    if raw_url is not None:
        url = check_url("--url", raw_url)
    elif env.get("PROHOST_WS_URL", "").strip():
        url = check_url("$PROHOST_WS_URL", env["PROHOST_WS_URL"])

    raw_machine = getattr(ns, "machine", None)
    machine = check_machine(raw_machine) if raw_machine is not None else default_machine_name()

    raw_workdir = getattr(ns, "workdir", None)
    if raw_workdir is None:
        workdir = home / WORKSPACE_DIR
    elif not raw_workdir.strip():
        raise OptionError("--workdir must be a directory (got an empty path)")
    else:
        workdir = _expand_path(raw_workdir, env, cwd)

    raw_timeout = getattr(ns, "timeout", None)
    timeout_s = 0.0 if raw_timeout is None else parse_seconds("--timeout", raw_timeout)
    raw_idle = getattr(ns, "idle_timeout", None)
    idle_timeout_s = (
        DEFAULT_IDLE_TIMEOUT_S if raw_idle is None else parse_seconds("--idle-timeout", raw_idle)
    )
    raw_concurrency = getattr(ns, "concurrency", None)
    concurrency = 1 if raw_concurrency is None else parse_concurrency(raw_concurrency)

    repos: tuple[Path, ...] = ()
    raw_repos = getattr(ns, "repos", None)
    if raw_repos is not None:
        try:
            repos = parse_repos(raw_repos, env=env, cwd=cwd,
                                require_checkouts=require_checkouts)
        except ReposFlagError as exc:
            raise OptionError(str(exc)) from None

    raw_accounts = getattr(ns, "accounts", None) or []
    accounts = parse_accounts(raw_accounts, env, cwd)
    limit_wait_s = parse_limit_wait(getattr(ns, "limit_wait", None))
    raw_max_queued = getattr(ns, "max_queued", None)
    max_queued = MAX_QUEUED_RUNS if raw_max_queued is None else parse_max_queued(raw_max_queued)
    raw_max_cost = getattr(ns, "max_cost", None)
    max_cost_usd = None if raw_max_cost is None else parse_max_cost(raw_max_cost)

    brain = parse_brain(getattr(ns, "brain", None))
    sandbox = parse_sandbox(getattr(ns, "sandbox", None))
    allow_write = parse_allowed("--allow-write", getattr(ns, "allow_write", None) or [], env, cwd)
    allow_read = parse_allowed("--allow-read", getattr(ns, "allow_read", None) or [], env, cwd)
    problem = shell_tail_problem(brain, exec_command)
    if problem is not None:
        raise OptionError(problem)

    return Options(
        home=home,
        exec_command=exec_command,
        url=url,
        machine=machine,
        workdir=workdir,
        timeout_s=timeout_s,
        idle_timeout_s=idle_timeout_s,
        concurrency=concurrency,
        dry_run=bool(getattr(ns, "dry_run", False)),
        allow_unverified=bool(getattr(ns, "allow_unverified", False)),
        brain=brain,
        safe_tools=bool(getattr(ns, "safe_tools", False)),
        repos=repos,
        accounts=accounts,
        limit_wait_s=limit_wait_s,
        max_queued=max_queued,
        max_cost_usd=max_cost_usd,
        sandbox=sandbox,
        allow_write=allow_write,
        allow_read=allow_read,
        acp_model=parse_per_account("--acp-model", getattr(ns, "acp_model", None), accounts),
        acp_mode=parse_per_account("--acp-mode", getattr(ns, "acp_mode", None), accounts),
    )


def parse_per_account(flag: str, raw: list[str] | None,
                      accounts: tuple[tuple[str, Path], ...]) -> tuple[tuple[str, str], ...]:
    """``[ACCOUNT=]VALUE`` values of ``flag``: ("", VALUE) for every account, or for
    the account named (one of ``--account``'s, or ``default`` when there are none);
    one value per account, else :class:`OptionError`."""
    names = {name for name, _ in accounts} or {"default"}
    found: dict[str, str] = {}
    for item in raw or []:
        account, _, value = item.strip().rpartition("=") if "=" in item else ("", "", item)
        account, value = account.strip(), value.strip()
        if not value:
            raise OptionError(f"{flag} needs a value: {flag} VALUE or {flag} ACCOUNT=VALUE")
        if account and account not in names:
            raise OptionError(f"{flag} {item}: no account is named {account!r} "
                              f"(the accounts: {', '.join(sorted(names))})")
        if account in found:
            raise OptionError(f"{flag} is given twice for "
                              f"{'account ' + repr(account) if account else 'every account'}")
        found[account] = value
    return tuple(found.items())


def parse_sandbox(raw: str | None) -> str:
    """``--sandbox``: one of :data:`SANDBOX_CHOICES` (default ``auto``)."""
    return _parse_choice("--sandbox", raw, SANDBOX_CHOICES, "auto")


def _parse_choice(flag: str, raw: str | None, choices: Sequence[str], default: str) -> str:
    """``flag``'s value: one of ``choices``, or ``default`` when the flag is not given."""
    if raw is None:
        return default
    if raw not in choices:
        raise OptionError(f"{flag} must be one of {', '.join(choices)} (got {raw!r})")
    return raw


def parse_allowed(flag: str, raws: Sequence[str], env: Mapping[str, str],
                  cwd: Path) -> tuple[Path, ...]:
    """Every ``--allow-write`` or ``--allow-read`` path: absolute, ``~`` expanded,
    each once, and existing. A missing path is an error, not a grant of nothing: a
    typo would otherwise surface only when a run's write is refused, far away. (The
    grant itself is made on the real path, when a run is confined: a link never
    widens it.)"""
    paths: list[Path] = []
    for raw in raws:
        if not raw.strip():
            raise OptionError(f"{flag} must be {VALUE_DESCRIPTIONS[flag]} (got an empty path)")
        path = _expand_path(raw.strip(), env, cwd)
        if not os.path.exists(path):
            raise OptionError(f"{flag} {path}: no such file or folder; create it first, or "
                              "fix the path")
        if path not in paths:
            paths.append(path)
    return tuple(paths)


def parse_brain(raw: str | None) -> str:
    """``--brain``: one of :data:`BRAIN_CHOICES` (default ``auto``)."""
    return _parse_choice("--brain", raw, BRAIN_CHOICES, "auto")


#: An account name: it appears in status, heartbeats and the panel.
_ACCOUNT_NAME = re.compile(r"[A-Za-z0-9_.-]{1,32}")
ACCOUNT_FORM = "NAME=DIR, e.g. --account work=~/.claude-work"


def parse_account(raw: str, env: Mapping[str, str], cwd: Path) -> tuple[str, Path]:
    """One ``--account NAME=DIR``: the name and the folder, absolute, ``~`` expanded.

    The folder must exist and be a directory: a typo would otherwise send the
    agent to an empty folder, where it is signed out, and fail every run there.
    """
    name, sep, folder = raw.partition("=")
    name = name.strip()
    if not sep or not name or not folder.strip():
        raise OptionError(f"--account must be {ACCOUNT_FORM} (got {raw!r})")
    if not _ACCOUNT_NAME.fullmatch(name):
        raise OptionError(
            f"--account name must be 1 to 32 letters, digits, '_', '.' or '-' (got {name!r})"
        )
    path = _expand_path(folder.strip(), env, cwd)
    if not path.exists():
        raise OptionError(
            f"--account {name}: {path} does not exist; log the agent in there first "
            f"(e.g. CLAUDE_CONFIG_DIR={path} claude) or fix the path"
        )
    if not path.is_dir():
        raise OptionError(f"--account {name}: {path} is not a directory")
    return name, path


def parse_accounts(
    raws: Sequence[str], env: Mapping[str, str], cwd: Path
) -> tuple[tuple[str, Path], ...]:
    """Every ``--account`` flag, in order; a name given twice is an error."""
    accounts: list[tuple[str, Path]] = []
    for raw in raws:
        name, path = parse_account(raw, env, cwd)
        if any(name == seen for seen, _ in accounts):
            raise OptionError(f"--account {name} is given twice; account names must be unique")
        accounts.append((name, path))
    return tuple(accounts)


def parse_max_cost(raw: str) -> float:
    """``--max-cost``: dollars, plainly written (``2``, ``2.50``, ``$0.75``; at most
    four decimals), above 0 and at most :data:`MAX_COST_USD`."""
    text = raw.strip()
    if _MONEY.fullmatch(text):
        value = float(text.removeprefix("$"))
        if 0 < value <= MAX_COST_USD:
            return value
    raise OptionError(f"--max-cost must be {MAX_COST_RANGE} (got {raw!r})")


def parse_limit_wait(raw: str | None) -> float:
    """``--limit-wait``: how long queued runs wait for a usage limit to reset
    (default :data:`DEFAULT_LIMIT_WAIT_S`)."""
    return DEFAULT_LIMIT_WAIT_S if raw is None else parse_seconds("--limit-wait", raw)
