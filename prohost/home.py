"""``$PROHOST_HOME``: where credentials, the lock and the agent's workspace live.

Layout (``~/.prohost`` unless ``$PROHOST_HOME`` says otherwise)::

    credentials.json   token, secret and endpoints from `prohost agent pair` (mode 0600)
    agent.lock         held (flock) by the one harness using this home; holds its pid
    ledger.sqlite3     the run ledger, and its -wal/-shm (mode 0600, prohost.engine.ledger)
    runs/              per-run scratch folders, e.g. MCP configurations (mode 0700)
    workspace/         the agent's default working directory

The home itself is 0700 whatever the umask, and is narrowed to 0700 (with a
warning) when it was looser: it holds the credentials and run bodies.

Everything that decides *which* server to talk to is also here
(:func:`resolve_endpoints`), because the answer depends on the credentials file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import stat
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import attrs

from prohost.files import write_atomically
from prohost.invocation import command

CREDENTIALS_FILE = "credentials.json"
LOCK_FILE = "agent.lock"
#: The run ledger (sqlite), in the home.
LEDGER_FILE = "ledger.sqlite3"
WORKSPACE_DIR = "workspace"
RUNS_DIR = "runs"
#: Mode of the home and of runs/ (octal): this user only.
PRIVATE_DIR_MODE = 0o700
#: Files the harness makes in its home: the user's alone.
PRIVATE_FILE_MODE = 0o600

log = logging.getLogger("prohost.home")
DEFAULT_WS_URL = "wss://api.prohost.ai/v1/agent/ws"

def _pair_hint() -> str:
    """How to pair: the code comes from the server (a chat service's web app shows
    one; the reference server's banner shows one and the exact command)."""
    return (f"run `{command('agent', 'pair', '--code', 'CODE', '--url', 'URL')}` with the "
            "one-time code and the URL your server gives (the service's web app; for "
            "`prohost server`, the command its banner prints; --url may be left out for "
            f"the default server, {DEFAULT_WS_URL})")


def prohost_home(env: Mapping[str, str], cwd: Path | None = None) -> Path:
    """``$PROHOST_HOME``, else ``~/.prohost``, as an absolute path.

    A relative ``$PROHOST_HOME`` is taken against ``cwd`` (default: the process's
    current directory) and fixed here, so that later ``chdir``s (an agent's workdir)
    can never move the home under a running harness. ``~`` is expanded from the
    given environment's ``HOME``, so tests can aim it at a temporary directory.
    """
    raw = env.get("PROHOST_HOME", "").strip()
    path = _expand_user(raw, env) if raw else _user_home(env) / ".prohost"
    if not path.is_absolute():
        path = (cwd if cwd is not None else Path.cwd()) / path
    return Path(os.path.normpath(path))


def _user_home(env: Mapping[str, str]) -> Path:
    home = env.get("HOME")
    return Path(home) if home else Path.home()


def _expand_user(raw: str, env: Mapping[str, str]) -> Path:
    if raw == "~":
        return _user_home(env)
    if raw.startswith("~/"):
        return _user_home(env) / raw[2:]
    return Path(raw)


# --- credentials -------------------------------------------------------------------


@attrs.frozen
class Credentials:
    """What pairing returned. ``token`` and ``secret`` must never reach a log or an agent."""

    token: str = attrs.field(repr=False)
    secret: str = attrs.field(repr=False)
    ws_url: str
    api_url: str | None = None
    account: str | None = None


class CredentialsError(Exception):
    """The credentials file is missing or unusable; the message says what to do."""


_REQUIRED_FIELDS = ("token", "secret", "ws_url")
_OPTIONAL_FIELDS = ("api_url", "account")


def credentials_from_json(data: Any, source: str) -> Credentials:
    """Check a decoded pairing answer / credentials file; ``source`` names it in errors.

    Raises :class:`ValueError` with a message naming the field that is wrong.
    """
    if not isinstance(data, dict):
        raise ValueError(f"{source} is not a JSON object")
    values: dict[str, str | None] = {}
    for name in _REQUIRED_FIELDS:
        value = data.get(name)
        if value is None:
            raise ValueError(f"{source} has no {name!r} field")
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{source} has an empty or non-text {name!r} field")
        values[name] = value
    for name in _OPTIONAL_FIELDS:
        value = data.get(name)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{source} has a non-text {name!r} field")
        # An empty api_url would otherwise win over deriving it from ws_url.
        values[name] = value or None
    ws_url = values["ws_url"]
    if ws_url is None:  # checked with the required fields above; this narrows the type
        raise ValueError(f"{source} has no 'ws_url' field")
    try:
        http_base_from_ws(ws_url)
    except ValueError as exc:
        raise ValueError(f"{source} has an unusable 'ws_url': {exc}") from None
    return Credentials(
        token=values["token"] or "",
        secret=values["secret"] or "",
        ws_url=ws_url,
        api_url=values["api_url"],
        account=values["account"],
    )


def credentials_path(home: Path) -> Path:
    return home / CREDENTIALS_FILE


def load_credentials(home: Path) -> Credentials:
    """Read ``home/credentials.json``; a :class:`CredentialsError` says what is wrong and what
    to do about it.
    """
    path = credentials_path(home)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CredentialsError(
            f"this machine is not paired yet (no {path}): {_pair_hint()}"
        ) from None
    except IsADirectoryError:
        raise CredentialsError(
            f"{path} is a directory, not a credentials file: remove it, then {_pair_hint()}"
        ) from None
    except PermissionError:
        raise CredentialsError(
            f"cannot read {path}: permission denied; it should belong to you with mode 0600 "
            f"(chmod 600 {path}), or pair again"
        ) from None
    except UnicodeDecodeError:
        raise CredentialsError(
            f"{path} is not UTF-8 text; it is damaged: {_pair_hint()} to rewrite it"
        ) from None
    except OSError as exc:
        raise CredentialsError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CredentialsError(
            f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}); "
            f"it is damaged: {_pair_hint()} to rewrite it"
        ) from None
    try:
        return credentials_from_json(data, str(path))
    except ValueError as exc:
        raise CredentialsError(f"{exc}: {_pair_hint()} to rewrite it") from None


def save_credentials(home: Path, creds: Credentials) -> Path:
    """Write ``home/credentials.json`` atomically with mode 0600; return its path.

    See :func:`prohost.files.write_atomically`: a reader sees the old credentials
    or the new ones, never half of either, and no other user can ever open them.
    """
    _make_home(home)
    path = credentials_path(home)
    data = {k: v for k, v in attrs.asdict(creds).items() if v is not None}
    payload = (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8")
    write_atomically(path, payload, 0o600)
    return path


def _make_home(home: Path) -> None:
    make_private_home(home)


def make_private_home(home: Path) -> None:
    """Create ``home`` 0700, or narrow it to 0700 when looser.

    0700 whatever the umask: the home holds the credentials and the ledger (run
    bodies, MCP tokens, replies). A home that other users could read or enter is
    narrowed with a warning, since it may have been exposed already.
    """
    existed = home.is_dir()
    home.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    mode = stat.S_IMODE(home.stat().st_mode)
    if existed and mode & 0o077:
        log.warning(
            "PROHOST_HOME %s was open to other users (mode %04o); narrowed it to 0700, "
            "since it holds the credentials and the run ledger. If other users could "
            "read it, consider pairing again to replace the credentials", home, mode)
    if mode != PRIVATE_DIR_MODE:
        os.chmod(home, PRIVATE_DIR_MODE)  # exactly 0700, whatever the umask


# --- endpoints ---------------------------------------------------------------------


def http_base_from_ws(url: str) -> str:
    """``ws://h:p/any/path`` → ``http://h:p``; ``wss://`` → ``https://``.

    Anything that is not a ws/wss URL with a host raises :class:`ValueError`
    naming what was wrong, because dialing it would fail later and less clearly.
    """
    parts = urllib.parse.urlsplit(url.strip())
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme)
    if scheme is None:
        raise ValueError(f"not a ws:// or wss:// URL: {url!r}")
    if not parts.hostname:
        raise ValueError(f"no host in {url!r}")
    try:
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        raise ValueError(f"not a port number in {url!r}") from None
    return f"{scheme}://{parts.netloc}"


def resolve_endpoints(flag_or_env_url: str | None, creds: Credentials | None) -> tuple[str, str]:
    """``(ws_url, api_base)`` per docs/protocol.md §1.

    An explicit URL (``--url`` or ``$PROHOST_WS_URL``) wins and the API base is
    derived from it, so pointing at a development server never sends results to
    the paired production API. Otherwise the credentials' ``ws_url`` and their
    ``api_url`` (else derived from that ``ws_url``); with no credentials, the
    built-in default. The API base never ends in ``/`` so paths can be appended.
    """
    if flag_or_env_url:
        ws_url = flag_or_env_url.strip()
        return ws_url, http_base_from_ws(ws_url)
    if creds is not None:
        api = creds.api_url or http_base_from_ws(creds.ws_url)
        return creds.ws_url, api.rstrip("/")
    return DEFAULT_WS_URL, http_base_from_ws(DEFAULT_WS_URL)


# --- single-instance lock ----------------------------------------------------------


#: What holds a home's lock, written after its pid: a harness (``agent run``), or
#: ``agent gc``, which holds it while it removes worktrees. A file with a pid alone
#: was written by a harness of an earlier version.
HARNESS = "harness"
GC = "gc"


class LockHeld(Exception):
    """Another process holds this home's lock; ``pid`` is its pid when it recorded
    one, ``kind`` what it is (:data:`HARNESS` or :data:`GC`; ``None``: not recorded)."""

    def __init__(self, pid: int | None, path: Path, kind: str | None = HARNESS) -> None:
        super().__init__(f"{path} is held by pid {pid}" if pid else f"{path} is held")
        self.pid = pid
        self.path = path
        self.kind = kind


def take_lock(path: Path, *, create: bool, shared: bool = False) -> int | None:
    """Open the lock file ``path`` and take its ``flock`` without waiting; the
    descriptor that holds it (closing it gives the lock back). ``None`` when there
    is no lock file and ``create`` is false (no harness ever ran there: nothing is
    made). Raises :class:`LockHeld` when another process holds it, else what
    opening or locking raised. ``shared``: only to tell whether it is held, never
    to keep it. The one way every command asks: a copy of it had drifted."""
    flags = os.O_CLOEXEC | (os.O_RDWR | os.O_CREAT if create else os.O_RDONLY)
    try:
        fd = os.open(path, flags, 0o600)
    except FileNotFoundError:
        if create:
            raise
        return None
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except OSError as exc:
        pid, kind = read_lock_holder(fd)
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise LockHeld(pid, path, kind) from None
        raise
    return fd


def lock_holder(home: Path) -> LockHeld | None:
    """Who holds ``home``'s lock (its pid and kind, each ``None`` when not recorded),
    or ``None`` when nobody does. The lock, not status.json: the kernel drops it
    with its holder however that dies, so a lock that is held means a live process.
    Creates and writes nothing."""
    try:
        fd = take_lock(home / LOCK_FILE, create=False, shared=True)
    except LockHeld as held:
        return held
    if fd is not None:
        os.close(fd)  # we got it: nobody holds it
    return None


#: ``agent stop`` makes ``drain-requested.<pid>`` as it asks that harness to drain:
#: a drain asked for twice is one drain (issue 37), even before the harness's status
#: says it drains. A harness removes those of earlier processes as it takes the lock.
DRAIN_REQUEST_PREFIX = "drain-requested."


def claim_drain(home: Path, pid: int) -> bool:
    """Whether this caller is the first to ask harness ``pid`` to drain (and so sends
    its signal); False when another already did. Made with ``O_EXCL``: of two
    ``agent stop`` run at once, one wins. True when it cannot tell (the home
    refuses the file): asking again is what it did before."""
    try:
        fd = os.open(home / f"{DRAIN_REQUEST_PREFIX}{pid}",
                     os.O_CREAT | os.O_EXCL | os.O_WRONLY, PRIVATE_FILE_MODE)
    except FileExistsError:
        return False
    except OSError:
        return True
    os.close(fd)
    return True


def forget_drain_requests(home: Path) -> None:
    """Remove the drain requests made for earlier processes (a pid may be reused)."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(home):
            if entry.name.startswith(DRAIN_REQUEST_PREFIX):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


class InstanceLock:
    """One harness per home: two would both execute every run they were sent.

    ``flock`` rather than a pid file: the kernel drops the lock when the holder
    dies however it dies (``kill -9`` included), so there is never a stale lock to
    clean up. The pid and kind written into the file are only for the message
    telling the user who holds it (and for ``agent stop``, which signals a harness
    and nothing else). The lock file is never deleted: unlinking it would let a
    third process lock a fresh inode while the second still holds the old one.
    The descriptor is not inherited by child processes (Python's default), so an
    agent left running cannot keep the home locked.
    """

    def __init__(self, fd: int, path: Path) -> None:
        self._fd: int | None = fd
        self.path = path

    @classmethod
    def acquire(cls, home: Path, *, kind: str = HARNESS) -> InstanceLock:
        """Take the lock without waiting, as ``kind`` (:data:`HARNESS`, :data:`GC`);
        raise :class:`LockHeld` if another process has it.

        Makes the home private first (:func:`make_private_home`), and its ``runs/``
        0700 whatever the umask: the per-run folders in it hold MCP configurations.
        """
        _make_home(home)
        runs = home / RUNS_DIR
        runs.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
        os.chmod(runs, PRIVATE_DIR_MODE)
        path = home / LOCK_FILE
        fd = take_lock(path, create=True)
        assert fd is not None  # made if missing
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {kind}\n".encode(), 0)
        except OSError as exc:
            # The pid is only for a second harness's message: the flock is what
            # counts, and a harness must come up on a full disk (it answers 503 for
            # what it cannot record, and recovers when space returns).
            logging.getLogger("prohost.home").warning(
                "could not write this harness's pid into %s (%s); the home is locked all "
                "the same", path, exc.strerror or exc)
        except BaseException:
            os.close(fd)
            raise
        if kind == HARNESS:
            forget_drain_requests(home)
        return cls(fd, path)

    def release(self) -> None:
        """Give the lock up (idempotent). Process exit releases it too."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            # Forget our pid first so nobody is told a dead process holds it.
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)  # closing the only descriptor releases the flock

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> InstanceLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def read_lock_holder(fd: int) -> tuple[int | None, str | None]:
    """The pid and kind written into the open ``agent.lock`` (``fd``), each ``None``
    when it does not read as one; a pid alone is an earlier harness's."""
    try:
        words = os.pread(fd, 64, 0).decode("ascii", "replace").split()
    except OSError:
        return None, None
    if not words or not (words[0].isascii() and words[0].isdigit()) or int(words[0]) <= 0:
        return None, None
    if len(words) == 1:
        return int(words[0]), HARNESS
    return int(words[0]), words[1] if words[1] in (HARNESS, GC) and len(words) == 2 else None


def stop_advice(err: LockHeld) -> str:
    """How to stop the harness that holds a home: ``agent stop`` (from a shell with
    the same ``PROHOST_HOME``) when it recorded its pid, else how to find it."""
    if err.pid:
        return (f"`{command('agent', 'stop')}` finishes its runs in progress, then it exits; "
                f"`{command('agent', 'stop', '--now')}` stops them too")
    return f"`lsof {err.path}` shows which process it is"


def other_home_advice(then: str) -> str:
    """How to run a second harness beside another: a home of its own, which must be
    paired with a new code before ``then`` (a command) can run there."""
    other = "/some/other/dir"
    return (f"give this one its own home, which needs a pairing of its own (a new code "
            f"from your server): `PROHOST_HOME={other} "
            f"{command('agent', 'pair', '--code', 'CODE', '--url', 'URL')}`, then "
            f"`PROHOST_HOME={other} {then}`")


def lock_held_message(err: LockHeld, home: Path) -> str:
    """What to tell someone who started a second harness on the same home."""
    if err.kind == GC:
        return gc_holds_it(err, home, "start again once it is done")
    who = f"(pid {err.pid})" if err.pid else "(its pid is not recorded)"
    return (
        f"another prohost agent {who} is already running with PROHOST_HOME={home}; "
        f"two would both execute every run. Either stop it first "
        f"({stop_advice(err)}), or "
        + other_home_advice(command("agent", "run") + " ...")
        # A lock file that does not say what holds it may be a gc's too.
        + ("" if err.kind == HARNESS else f"; if it is `{command('agent', 'gc')}` (it "
           "holds the home while it removes worktrees), start again once it is done")
    )


def gc_holds_it(err: LockHeld, home: Path, then: str) -> str:
    """What to tell someone whose command found ``agent gc`` holding ``home``."""
    return (f"`{command('agent', 'gc')}` (pid {err.pid}) is removing worktrees with "
            f"PROHOST_HOME={home} and holds it meanwhile; {then}")
