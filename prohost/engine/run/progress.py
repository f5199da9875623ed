"""What is known of a run while it goes on (its :class:`Progress`) and the words
its heartbeat uses while it waits for an account: the run's own facts, read by the
runner, the account gate, the held run and the views, and importing none of them."""

from __future__ import annotations

import time

import attrs

from prohost.engine.accounts.book import DEFAULT_ACCOUNT
from prohost.engine.accounts.limits import LimitNotice
from prohost.wire.usage import Usage


def waiting_activity(until: float) -> str:
    """A waiting run's heartbeat activity: the reset in local time, ``HH:MM``."""
    return f"waiting for an account (resets {time.strftime('%H:%M', time.localtime(until))})"


@attrs.define
class Progress:
    """What the runner learns while a run goes on, readable at any moment (also
    after a cancel: a cancelled run is reported with the session it had)."""

    session_id: str | None = None
    activity: str | None = None
    model: str | None = None
    attempts: int = 0
    #: trio time of the agent's latest output (the idle timer counts from it).
    last_output: float | None = None
    #: The account the current (or last) attempt runs on (PROTOCOL.md §12).
    account: str = DEFAULT_ACCOUNT
    #: What the last attempt's CLI said about its account's usage limit.
    limit: LimitNotice | None = None
    #: The last attempt failed because its account reached its usage limit.
    ended_by_limit: bool = False
    #: While the run waits for an account's limit to reset: when (epoch s).
    waiting_until: float | None = None
    #: What every attempt so far used, summed (§7 ``usage`` is the run's own).
    spent: Usage = attrs.field(factory=Usage)
    #: The session's running totals after the last attempt, for a CLI that reports
    #: those (Codex); saved with the session so its next turn counts its own.
    session_totals: Usage | None = None
