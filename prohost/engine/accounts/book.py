"""Agent accounts and which one a run gets (docs/protocol.md §12), as pure logic.

An :class:`AccountBook` knows each account's last reported usage and limit and
answers "which account should this run use?". It does no I/O and reads no clock:
every method that depends on time takes ``now`` (epoch seconds), so the harness
passes its clock and a test passes a number. The book is not thread-safe and
needs no lock under trio (no method awaits).
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from prohost.engine.accounts.limits import LimitNotice, LimitState

#: The account a harness without ``--account`` flags has; it changes nothing in
#: the agent's environment.
DEFAULT_ACCOUNT = "default"

#: How long an account that said it is limited, without saying until when, is
#: left alone before the next run tries it again (seconds).
UNKNOWN_RESET_S = 3600.0
#: An account that says it is still limited "until" a time already past (its CLI
#: repeats the reset it said before) is limited until an unknown time: it is tried
#: again after this (seconds), then after twice as long each time it says so again,
#: up to :data:`UNKNOWN_RESET_S`. Runs keep waiting meanwhile, within --limit-wait.
STALE_RESET_FIRST_S = 60.0

#: What an account name may be: it appears in status, heartbeats and file names.
ACCOUNT_NAME = re.compile(r"[A-Za-z0-9_.-]{1,32}")

#: Each brain's own variable for its configuration folder; every brain also gets
#: ``PROHOST_ACCOUNT_DIR``.
CONFIG_DIR_VARIABLES: Mapping[str, str] = {
    "claude": "CLAUDE_CONFIG_DIR",
    "codex": "CODEX_HOME",
}
ACCOUNT_DIR_VARIABLE = "PROHOST_ACCOUNT_DIR"
#: Where Claude Code keeps the login, apart from CLAUDE_CONFIG_DIR (read by 2.1.197,
#: the installed one: its plaintext store is ``<this>/.credentials.json``).
SECURE_STORAGE_VARIABLE = "CLAUDE_SECURESTORAGE_CONFIG_DIR"


def folder_variables(brain: str) -> tuple[str, ...]:
    """The variables naming the folders ``brain``'s CLI writes of its own (its
    conversation's folder, and Claude Code's login store beside it): what a
    confined run of it is granted (§13). None for another brain."""
    variable = CONFIG_DIR_VARIABLES.get(brain)
    if variable is None:
        return ()
    return (variable, SECURE_STORAGE_VARIABLE) if brain == "claude" else (variable,)


#: Under an account's own folders: each conversation's (``lanes/<lane folder>/<cli>``).
LANES_FOLDER = "lanes"
#: The lane folder name of a run without a lane (none reaches a run: a safe default).
NO_LANE = "no-lane"
#: Under an owned account's folders: Claude Code's login store (``login/claude``).
LOGIN_FOLDER = "login"


@attrs.frozen
class Account:
    """One login of the agent CLI: a name and its configuration folder.

    ``dir`` is ``None`` only for an implicit :data:`DEFAULT_ACCOUNT` made without a
    home (tests of the book alone). The harness's default account is ``owned``:
    ``dir`` is then the harness's own folder, one subfolder per CLI
    (:mod:`prohost.engine.accounts.logins`), never the person's ``~/.claude``.
    """

    name: str
    dir: Path | None = None
    owned: bool = False
    #: The harness's own folders of an account whose ``dir`` is the person's
    #: (``--account``): ``$PROHOST_HOME/cli/<name>``, holding each conversation's
    #: CLI folders. ``None``: the account's CLIs use ``dir`` itself (tests of the
    #: book alone). An ``owned`` account's are ``dir``.
    own: Path | None = None

    @property
    def root(self) -> Path | None:
        """The harness's own folders of this account, if it has any."""
        return self.dir if self.owned else self.own

    def cli_folder(self, cli: str, lane_folder: str = "") -> Path | None:
        """``cli``'s (claude, codex) folder for the conversation whose lane folder
        name is ``lane_folder``: its own (``<root>/lanes/<lane folder>/<cli>``), so
        no conversation reads another's sessions or obeys settings another
        planted (issue 36, attack 10); ``None`` for a CLI without a folder (the
        plain brain) or an account without folders of the harness's."""
        root = self.root
        if root is None or self.dir is None or cli not in CONFIG_DIR_VARIABLES:
            return None
        return root / LANES_FOLDER / (lane_folder or NO_LANE) / cli

    def login_folder(self) -> Path | None:
        """Where Claude Code keeps this account's login, shared by all its
        conversations (``CLAUDE_SECURESTORAGE_CONFIG_DIR``): the harness's own
        ``<root>/login/claude`` for an ``owned`` account (kept in step with the
        person's, :mod:`prohost.engine.accounts.logins`), the account's own folder
        for ``--account``; ``None`` without folders of the harness's."""
        if self.root is None or self.dir is None:
            return None
        return self.dir / LOGIN_FOLDER / "claude" if self.owned else self.dir

    def env(self, brain: str, lane_folder: str = "") -> dict[str, str]:
        """The variables that point ``brain``'s CLI (the brain's name, or the agent
        an ACP command starts) at this account's folder for the conversation whose
        lane folder name is ``lane_folder`` (:meth:`cli_folder`): nothing for an
        account without one, or for the plain brain of an ``owned`` account."""
        if self.dir is None:
            return {}
        conversation = self.cli_folder(brain, lane_folder)
        if self.root is not None:
            env = {} if self.owned else {ACCOUNT_DIR_VARIABLE: str(self.dir)}
            if conversation is None:
                return env
            env[CONFIG_DIR_VARIABLES[brain]] = str(conversation)
            if brain == "claude":
                # One login for every conversation of the account: Claude Code
                # reads and writes its credential store (and takes its refresh
                # lock) in this folder, apart from CLAUDE_CONFIG_DIR.
                env[SECURE_STORAGE_VARIABLE] = str(self.login_folder())
                if sys.platform == "darwin" and self.owned:
                    # macOS keeps the login in the Keychain, under an entry named
                    # by a hash of this folder; an empty one names the default
                    # entry, the person's own login (daymade/claude-code-skills#592,
                    # anthropics/claude-code#79223). No file to share there.
                    env[SECURE_STORAGE_VARIABLE] = ""
            return env
        folder = str(self.dir)
        env = {ACCOUNT_DIR_VARIABLE: folder}
        variable = CONFIG_DIR_VARIABLES.get(brain)
        if variable is not None:
            env[variable] = folder
        return env


@attrs.define
class _Standing:
    """What is known about one account."""

    state: LimitState = "ok"
    #: Until when it is limited (or when its reported window resets), epoch s.
    resets_at: float | None = None
    used_percent: float | None = None
    #: When a run last started on it (epoch s); ``None``: never.
    last_started: float | None = None
    #: How many times in a row it said it is limited until a time already past.
    stale_resets: int = 0


class AccountError(ValueError):
    """The accounts given cannot form a book (duplicate or malformed names)."""


class AccountBook:
    """Every account, its standing, and the rule that picks one for a run."""

    def __init__(self, accounts: Iterable[Account] = ()) -> None:
        listed = list(accounts) or [Account(DEFAULT_ACCOUNT)]
        names = [account.name for account in listed]
        for name in names:
            if not ACCOUNT_NAME.fullmatch(name):
                raise AccountError(
                    f"account name {name!r} must be 1 to 32 letters, digits, '_', '.' or '-'")
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise AccountError(f"account names must be unique; repeated: {', '.join(duplicates)}")
        self._accounts: dict[str, Account] = {account.name: account for account in listed}
        self._standing: dict[str, _Standing] = {name: _Standing() for name in names}

    @property
    def accounts(self) -> tuple[Account, ...]:
        """Every account, in the order given."""
        return tuple(self._accounts.values())

    def account(self, name: str) -> Account:
        """The account called ``name``; :class:`KeyError` naming it when unknown."""
        try:
            return self._accounts[name]
        except KeyError:
            raise KeyError(f"no account named {name!r}") from None

    def _expire(self, now: float) -> None:
        """A limit whose reset time has come is over: the account is usable again."""
        for standing in self._standing.values():
            if (standing.state == "limited" and standing.resets_at is not None
                    and standing.resets_at <= now):
                standing.state, standing.resets_at, standing.used_percent = "ok", None, None

    def state(self, name: str, now: float) -> LimitState:
        """``ok``, ``warning`` or ``limited`` for the account ``name`` at ``now``."""
        self.account(name)
        self._expire(now)
        return self._standing[name].state

    def choose(self, now: float, *, lane_account: str | None = None,
               exclude: Collection[str] = ()) -> Account | None:
        """The account the next run should use, or ``None`` when none is usable.

        The lane's account while it is usable (its session lives there); else the
        usable account with the most headroom known: the lowest last-reported use
        (none reported counts as none used), then the least recently started
        (never started first), then the order given. ``exclude`` names accounts
        this run has already tried.
        """
        self._expire(now)
        if (lane_account is not None and lane_account in self._accounts
                and lane_account not in exclude
                and self._standing[lane_account].state != "limited"):
            return self._accounts[lane_account]
        candidates = [
            (index, name) for index, name in enumerate(self._accounts)
            if name not in exclude and self._standing[name].state != "limited"
        ]
        if not candidates:
            return None

        def headroom(entry: tuple[int, str]) -> tuple[float, float, int]:
            index, name = entry
            standing = self._standing[name]
            used = standing.used_percent if standing.used_percent is not None else 0.0
            started = standing.last_started if standing.last_started is not None else -math.inf
            return (used, started, index)

        return self._accounts[min(candidates, key=headroom)[1]]

    def started(self, name: str, now: float) -> None:
        """A run was spawned on ``name`` at ``now`` (for the least-recently-started rule)."""
        self.account(name)
        self._standing[name].last_started = now

    def report(self, name: str, notice: LimitNotice | None, now: float) -> bool:
        """Record what an attempt on ``name`` learned; whether the snapshot changed.

        ``limited`` lasts until the notice's reset, or :data:`UNKNOWN_RESET_S` from
        ``now`` when it gave none; a reset already past is unknown too, and lasts
        :data:`STALE_RESET_FIRST_S`, doubled each time it is said again.
        ``warning`` and ``ok`` are recorded with their figures and change nothing
        about choosing except through the use they report; they do not lift a
        limit before its reset.
        """
        self.account(name)
        if notice is None:
            return False
        before = self.snapshot(now)
        standing = self._standing[name]
        if notice.state == "limited":
            until = notice.resets_at if notice.resets_at is not None else now + UNKNOWN_RESET_S
            if until <= now:
                # Still limited, its reset already past: not usable now, but when is
                # unknown. Tried again after a backoff (issue 37: taking it as usable
                # handed a waiting run back long before --limit-wait).
                until = now + min(UNKNOWN_RESET_S,
                                  STALE_RESET_FIRST_S * 2 ** standing.stale_resets)
                standing.stale_resets += 1
            else:
                standing.stale_resets = 0
            standing.state, standing.resets_at = "limited", until
            if notice.used_percent is not None:
                standing.used_percent = notice.used_percent
        elif standing.state == "limited":
            # Limited means until the reset (§12): an "allowed" figure from an
            # attempt that started before the refusal does not end it early.
            if notice.used_percent is not None:
                standing.used_percent = notice.used_percent
        else:
            standing.stale_resets = 0
            standing.state = notice.state
            standing.resets_at = notice.resets_at
            if notice.used_percent is not None:
                standing.used_percent = notice.used_percent
        return self.snapshot(now) != before

    def restore(self, name: str, limited_until: float, now: float) -> None:
        """Remember a limit from before a restart (the ledger's copy), so the
        harness does not spend a run finding it again. Unknown names and past
        times are ignored: the account may be gone or usable by now."""
        if name in self._standing and limited_until > now:
            standing = self._standing[name]
            standing.state, standing.resets_at = "limited", limited_until

    def all_limited(self, now: float) -> bool:
        """Whether no account is usable now."""
        self._expire(now)
        return all(standing.state == "limited" for standing in self._standing.values())

    def earliest_reset(self, now: float) -> float | None:
        """When the first limited account becomes usable again (epoch s), or
        ``None`` when none is limited."""
        self._expire(now)
        times = [standing.resets_at for standing in self._standing.values()
                 if standing.state == "limited" and standing.resets_at is not None]
        return min(times) if times else None

    def limits(self, now: float) -> dict[str, float]:
        """Every limited account and until when: what the ledger keeps."""
        self._expire(now)
        return {name: standing.resets_at for name, standing in self._standing.items()
                if standing.state == "limited" and standing.resets_at is not None}

    def snapshot(self, now: float) -> list[dict[str, Any]]:
        """``status.accounts`` (§12): one object per account, in the order given."""
        self._expire(now)
        out: list[dict[str, Any]] = []
        for name, standing in self._standing.items():
            resets = standing.resets_at if standing.state != "ok" else None
            used = standing.used_percent
            out.append({
                "name": name,
                "state": standing.state,
                "resets_at": int(resets) if resets is not None else None,
                "used_percent": round(used, 1) if used is not None else None,
            })
        return out

    def statistics(self, now: float) -> list[dict[str, Any]]:
        """The same as :meth:`snapshot`, for the panel and ``agent status``."""
        return self.snapshot(now)
