"""Each conversation's CLI folders are the harness's own; an account's login is
shared by all of them and with the person's (issue 36, point 5 and attack 10; §13).

A run may write its CLI's folder (settings, hooks, MCP server lists, sessions), so
that folder can never be the person's ``~/.claude`` or ``~/.codex`` (whatever a run
left there would run later in the person's own sessions), nor one another
conversation's runs use (they would read its transcripts and obey the settings it
planted). So each conversation has its own, per account:
``$PROHOST_HOME/cli/<account>/lanes/<lane folder>/claude`` (``CLAUDE_CONFIG_DIR``)
and ``.../codex`` (``CODEX_HOME``), made at its first run, removed with its
worktrees by ``agent gc`` (:meth:`~prohost.engine.accounts.book.Account.cli_folder`).

Claude Code keeps its login apart from ``CLAUDE_CONFIG_DIR`` when
``CLAUDE_SECURESTORAGE_CONFIG_DIR`` is set (read in the installed CLI, 2.1.197:
``m7()`` returns that variable, else the config folder; its plaintext store reads
and writes ``<m7()>/.credentials.json`` by a temporary file and a rename, and its
token refresh takes its lock in that folder too). So every conversation of an
account shares one login store: the harness's ``$PROHOST_HOME/cli/<account>/login/
claude`` for the default account (kept in step with the person's, below), the
``--account`` folder itself for another. Codex keeps its login in
``CODEX_HOME/auth.json`` alone, so each conversation's folder holds a copy kept in
step with the account's (the person's ``~/.codex``, or the ``--account`` folder)
the same way.

Each such copy must stay one login with the person's, because both CLIs
rotate the refresh token at each refresh, so two copies of one login log each other
out (anthropics/claude-code#76561; Codex: "your refresh token was already used").
So at each run's start and end :func:`sync_login` takes whichever copy is newer and
writes it over the other:

- Claude Code keeps it in ``<CLAUDE_CONFIG_DIR>/.credentials.json`` on Linux
  (code.claude.com/docs/en/authentication, "Credential management"), as
  ``{"claudeAiOauth": {"accessToken", "refreshToken", "expiresAt" (ms), "scopes",
  "subscriptionType"}}`` (beside other entries, MCP servers' OAuth tokens, which
  stay the person's); newer: the later ``expiresAt``. It writes the file by a
  temporary file and a rename.
- Codex keeps it in ``$CODEX_HOME/auth.json`` (openai/codex
  ``codex-rs/core/src/auth/storage.rs``: ``AuthDotJson`` = ``OPENAI_API_KEY``,
  ``tokens`` {``id_token``, ``access_token``, ``refresh_token``, ``account_id``},
  ``last_refresh`` RFC 3339; ``FileAuthStorage::save`` truncates and writes it in
  place, 0600); newer: the later ``last_refresh``. A copy of another
  ``account_id`` never replaces the person's.

The harness's copy is in a folder every run of the account may write, so it is
read as a hostile file: opened without following a link, a regular file of at
most :data:`MAX_BYTES`, a JSON document with a login of the shape above (strings,
numbers, lists of strings); only that login part is ever copied, written by a new
0600 file renamed over the target (which replaces a link rather than writing
through it). Nothing else of either folder is ever copied.
The person's file is never created: a person logged out (or logged in by a
variable) stays so.

Codex's settings are the person's too: its model provider, base URL and the rest
of ``config.toml`` (a provider configured there is how Codex logs in to it), which
the harness's folder would otherwise lack. So :func:`seed_files` copies the
person's ``config.toml`` one way, person → harness, whenever the person's copy is
newer than the harness's (what Codex or a run wrote in the harness's copy stays
until the person changes theirs); nothing ever goes the other way. Claude Code's
settings are not seeded from the person's: its endpoint and key come from
variables the harness passes on, and its ``settings.json`` holds hooks,
permissions and plugins of the person's interactive sessions (docs/security.md
says why). What the person wants every conversation's Claude Code to have goes in
``$PROHOST_HOME/cli/<account>/shared/claude`` (``settings.json``, ``CLAUDE.md``),
no run's place, seeded one way into each conversation's folder
(:func:`seed_shared`).

Every file of the person's or of the harness's is read by one function,
:func:`read_guarded`: never through a link at its end, never from a folder whose
real path lies in a hidden place (a secret store), a regular file of bounded size.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import secrets
import stat
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import attrs

from prohost.engine.accounts.book import Account

log = logging.getLogger("prohost.accounts")

#: The harness's own CLI folders, under ``$PROHOST_HOME``: ``cli/<account>/<cli>``.
CLI_FOLDER = "cli"
#: Each CLI's login file, in its folder.
LOGIN_FILES: Mapping[str, str] = {"claude": ".credentials.json", "codex": "auth.json"}
#: Each CLI's folder variable, and its default under ``$HOME``.
FOLDER_VARIABLES: Mapping[str, tuple[str, str]] = {
    "claude": ("CLAUDE_CONFIG_DIR", ".claude"),
    "codex": ("CODEX_HOME", ".codex"),
}
#: A credentials document is a few KiB; anything larger is not one.
MAX_BYTES = 64 * 1024
#: Files of the person's CLI folder seeded one way into the harness's (its settings).
SEEDED_FILES: Mapping[str, tuple[str, ...]] = {"codex": ("config.toml",)}
#: Under an account's folders of the harness's: what the person gives every
#: conversation of it (``shared/claude``), seeded one way into each one's folder.
SHARED_FOLDER = "shared"
#: The files of :data:`SHARED_FOLDER` seeded (Claude Code's settings and memory).
SHARED_FILES = ("settings.json", "CLAUDE.md")
#: A settings file larger than this is not seeded.
SETTINGS_MAX_BYTES = 1024 * 1024

Direction = Literal["to harness", "to person"]

_ONE_AT_A_TIME = threading.Lock()


@attrs.frozen
class SharedLogin:
    """One CLI's login file in the person's folder and its copy in the harness's."""

    cli: str
    person: Path
    harness: Path
    #: Files seeded person → harness (:data:`SEEDED_FILES`), by name in both folders.
    seeds: tuple[str, ...] = ()
    #: Places never read from (the secret stores; the caller's list).
    hidden: tuple[Path, ...] = ()


class Refused(Exception):
    """A file the harness will not read; the message says why, naming it."""


def read_guarded(path: Path, *, hidden: Sequence[Path] = (),
                 max_bytes: int = MAX_BYTES) -> bytes | None:
    """The bytes of ``path``, read as a file a run may have written, linked or
    planted (a CLI folder is one of its places): ``None`` when it is missing.
    Raises :class:`Refused` when the real path of its folder lies in one of
    ``hidden`` (the secret stores: a run that made Codex's folder or its config a
    link to ``~/.cargo`` would otherwise have a token copied into the next run's
    folder, issue 36 attack 7), when it is a symbolic link (opened with
    ``O_NOFOLLOW``, never followed), not a regular file, or over ``max_bytes``;
    ``OSError`` when it cannot be read. Blocking."""
    real = path.parent.resolve()
    for place in hidden:
        place = place.resolve()
        if real == place or place in real.parents:
            raise Refused(f"{path.parent} lies in {place}, which runs may not read")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refused(f"{path} is a symbolic link, which a run may have made: "
                          "not followed") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
            raise Refused(f"{path} is not a regular file of at most {max_bytes} bytes: "
                          "not read")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise Refused(f"{path} is larger than {max_bytes} bytes: not read")
        return data
    finally:
        os.close(fd)


def owned_folder(home: Path, account: str) -> Path:
    """The harness's CLI folders of ``account`` (one subfolder per CLI)."""
    return home / CLI_FOLDER / account


def person_login(cli: str, harness_folder: Path, env: Mapping[str, str],
                 hidden: Sequence[Path] = (), *, person: Path | None = None) -> SharedLogin | None:
    """The login ``cli``'s folder ``harness_folder`` shares with the person's own
    folder (``person``, an ``--account``'s; else the person's variable in ``env``,
    else its default under ``HOME``), with the settings seeded from it
    (:data:`SEEDED_FILES`), neither ever read from one of ``hidden``; ``None`` for
    a CLI that keeps no login file."""
    if cli not in LOGIN_FILES:
        return None
    if person is None:
        variable, default = FOLDER_VARIABLES[cli]
        named = env.get(variable, "").strip()
        home = env.get("HOME", "").strip()
        person = Path(named) if named else (Path(home) if home else Path.home()) / default
    return SharedLogin(cli, person / LOGIN_FILES[cli], harness_folder / LOGIN_FILES[cli],
                       seeds=SEEDED_FILES.get(cli, ()), hidden=tuple(hidden))


def open_cli_folders(account: Account, cli: str, lane_folder: str, env: Mapping[str, str],
                     hidden: Sequence[Path] = ()) -> None:
    """Make the folder of ``cli`` (claude, codex) for the conversation whose lane
    folder name is ``lane_folder`` on ``account`` (:meth:`Account.cli_folder`) and
    keep its login one with the account's:

    - Claude Code: every conversation's CLI reads and writes one login store,
      ``CLAUDE_SECURESTORAGE_CONFIG_DIR`` (:meth:`Account.login_folder`); an owned
      account's store is the harness's, kept in step with the person's
      ``~/.claude`` (:func:`open_folder`); an ``--account``'s is its own folder.
    - Codex keeps its login in ``CODEX_HOME/auth.json`` alone, so the
      conversation's copy is kept in step with the account's (the person's
      ``~/.codex``, or the ``--account`` folder) by :func:`open_folder`, its
      ``config.toml`` seeded one way from there.

    Nothing for a CLI without a folder. Never raises an OSError (logged: its CLI
    then says it is not logged in). Blocking file I/O."""
    folder = account.cli_folder(cli, lane_folder)
    if folder is None:
        return
    theirs = None if account.owned else account.dir
    if cli != "claude":
        open_folder(folder, person_login(cli, folder, env, hidden, person=theirs))
        return
    open_folder(folder, None)
    root = account.root
    if root is not None:
        seed_shared(root / SHARED_FOLDER / cli, folder, hidden)
    login = account.login_folder()
    if login is not None and account.owned:
        open_folder(login, person_login(cli, login, env, hidden))


def seed_shared(shared: Path, folder: Path, hidden: Sequence[Path] = ()) -> list[str]:
    """Copy each of :data:`SHARED_FILES` from ``shared`` (the person's settings for
    every conversation of an account, ``$PROHOST_HOME/cli/<account>/shared/claude``:
    no run's place) into a conversation's ``folder`` where it is newer, as
    :func:`seed_files` does; the names copied. Never raises. Blocking file I/O."""
    copied = []
    for name in SHARED_FILES:
        try:
            with _ONE_AT_A_TIME:
                if _seed(shared / name, folder / name, tuple(hidden)):
                    copied.append(name)
        except Refused as exc:
            log.warning("%s: not copied into the conversation's folder", exc)
        except OSError as exc:
            log.warning("could not copy %s into %s: %s", shared / name, folder,
                        exc.strerror or exc)
    return copied


def open_folder(folder: Path, login: SharedLogin | None) -> Direction | None:
    """Make the harness's CLI folder (0700; Codex refuses a CODEX_HOME that does not
    exist), share ``login`` with it (:func:`sync_login`) and seed its settings from
    the person's (:func:`seed_files`). Never raises an OSError: logged, and the run
    goes on (its CLI then says it is not logged in). Blocking file I/O."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("could not make the CLI folder %s: %s", folder, exc.strerror or exc)
        return None
    if login is None:
        return None
    seed_files(login)
    return sync_login(login)


def seed_files(login: SharedLogin) -> list[str]:
    """Copy each of ``login``'s seeded files (Codex's ``config.toml``) from the
    person's folder into the harness's where the person's is newer (or the
    harness's is missing, or dated in the future, where a run could have pinned
    it): one way, person → harness, read by :func:`read_guarded` (never through a
    link, never from a secret store) and written by a new 0600 file renamed over
    the harness's (a link there is replaced, never written through). The names
    copied. Never raises: what cannot be read or written is logged and left as it
    is. Blocking file I/O."""
    copied = []
    for name in login.seeds:
        person, harness = login.person.with_name(name), login.harness.with_name(name)
        try:
            with _ONE_AT_A_TIME:
                if _seed(person, harness, login.hidden):
                    copied.append(name)
        except Refused as exc:
            log.warning("%s: not copied into the harness's %s folder", exc, login.cli)
        except OSError as exc:
            log.warning("could not copy %s into %s: %s", person, harness, exc.strerror or exc)
    return copied


def _seed(person: Path, harness: Path, hidden: tuple[Path, ...]) -> bool:
    try:
        theirs = os.lstat(person).st_mtime_ns
    except FileNotFoundError:
        return False
    try:
        ours: int | None = os.lstat(harness).st_mtime_ns
    except FileNotFoundError:
        ours = None
    if ours is not None and theirs <= ours <= time.time_ns():
        return False
    data = read_guarded(person, hidden=hidden, max_bytes=SETTINGS_MAX_BYTES)
    if data is None:
        return False
    _replace(harness, data)
    return True


def sync_login(login: SharedLogin) -> Direction | None:
    """Make both copies of ``login`` the newer one; which way it copied, or ``None``.
    Never raises: a copy that cannot be read or written is logged (without its
    content) and left as it is. Blocking file I/O."""
    try:
        # One at a time: attempts of concurrent runs start and end together, and
        # each compares both copies before it writes one.
        with _ONE_AT_A_TIME:
            return _sync(login)
    except OSError as exc:
        log.warning("could not share the %s login between %s and %s: %s", login.cli,
                    login.person, login.harness, exc.strerror or exc)
        return None


def _sync(login: SharedLogin) -> Direction | None:
    person = _read(login.person, login.hidden)
    if person is None:
        return None  # never made: the person's logout stands
    person_doc = _document(login.cli, person)
    if person_doc is None:
        log.warning("%s is not a %s credentials document as the harness knows it: not "
                    "shared with the harness's runs", login.person, login.cli)
        return None
    harness = _read(login.harness, login.hidden)
    harness_doc = _document(login.cli, harness) if harness is not None else None
    mine, theirs = _login(login.cli, person_doc), (
        _login(login.cli, harness_doc) if harness_doc is not None else None)
    if theirs is not None and theirs == mine:
        return None
    if (theirs is not None and harness_doc is not None
            and _same_account(login.cli, person_doc, harness_doc)
            and _freshness(login.cli, harness_doc) > _freshness(login.cli, person_doc)):
        # The person's document, with only its login replaced: whatever else a run
        # wrote in the harness's copy never reaches the person.
        _replace(login.person, _encode({**person_doc, **theirs}))
        return "to person"
    if harness is not None and harness_doc is None:
        log.warning("the harness's copy of the %s login (%s) is not a credentials "
                    "document: replaced by the person's", login.cli, login.harness)
    # Only the login: other entries of the person's file (Claude Code's MCP servers'
    # OAuth tokens, say) are not the runs'; those the runs' own copy holds stay.
    _replace(login.harness, _encode({**(harness_doc or {}), **mine}))
    return "to harness"


def _login(cli: str, doc: dict[str, Any]) -> dict[str, Any]:
    """The login part of a credentials document: all that is ever copied."""
    if cli == "claude":
        return {"claudeAiOauth": doc["claudeAiOauth"]}
    return {key: doc[key] for key in ("OPENAI_API_KEY", "tokens", "last_refresh") if key in doc}


def _encode(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, indent=2).encode()


def _read(path: Path, hidden: tuple[Path, ...] = ()) -> bytes | None:
    """The file's bytes (:func:`read_guarded`), or ``None`` when it is missing or
    refused (logged). Raises OSError otherwise."""
    try:
        return read_guarded(path, hidden=hidden)
    except Refused as exc:
        log.warning("%s", exc)
        return None


def _scalar(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool) or (
        isinstance(value, list) and all(isinstance(item, str) for item in value))


def _document(cli: str, data: bytes) -> dict[str, Any] | None:
    """``data`` as the CLI's credentials document, or ``None`` when it is anything
    else (not JSON, no login of the CLI's shape). Its login part (:func:`_login`)
    must hold strings, numbers and lists of strings only; other top-level entries
    are kept as they are in the person's file and never copied."""
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    if cli == "claude":
        oauth = doc.get("claudeAiOauth")
        if not isinstance(oauth, dict) or not all(_scalar(value) for value in oauth.values()):
            return None
        if not (isinstance(oauth.get("accessToken"), str)
                and isinstance(oauth.get("refreshToken"), str)
                and isinstance(oauth.get("expiresAt"), int)):
            return None
        return doc
    key = doc.get("OPENAI_API_KEY")
    tokens = doc.get("tokens")
    if key is not None and not isinstance(key, str):
        return None
    if tokens is not None and not (isinstance(tokens, dict) and isinstance(
            tokens.get("refresh_token"), str) and all(_scalar(v) for v in tokens.values())):
        return None
    if key is None and tokens is None:
        return None
    refreshed = doc.get("last_refresh")
    if refreshed is not None and _instant(refreshed) is None:
        return None
    return doc


def _instant(value: object) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        # Codex writes microseconds and a Z (chrono's to_rfc3339_opts(Micros, true)).
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _freshness(cli: str, doc: dict[str, Any]) -> float:
    if cli == "claude":
        return float(doc["claudeAiOauth"]["expiresAt"])
    return _instant(doc.get("last_refresh")) or 0.0


def _same_account(cli: str, person: dict[str, Any], harness: dict[str, Any]) -> bool:
    """Whether the harness's copy may replace the person's: for Codex, the same
    ``account_id`` (a run's own login of another account never reaches the
    person). Claude Code's file names no account: see docs/security.md."""
    if cli != "codex":
        return True
    mine, theirs = person.get("tokens") or {}, harness.get("tokens") or {}
    return bool(mine.get("account_id")) and mine.get("account_id") == theirs.get("account_id")


def _replace(target: Path, data: bytes) -> None:
    """``target`` made a new 0600 file holding ``data``: written beside it and renamed
    over it, so a link there is replaced, never written through."""
    # A name no other writer uses (runs end together; each shares in its own thread).
    temporary = target.with_name(f".{target.name}.prohost-{secrets.token_hex(8)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        with os.fdopen(fd, "wb", closefd=False) as handle:
            handle.write(data)
            handle.flush()
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    os.close(fd)
    os.replace(temporary, target)

