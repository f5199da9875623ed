"""The short texts every view of the harness shares: durations, hosts, run ids, the brain, accounts.

Pure and terminal-free: the live panel and its plain-log fallback
(:mod:`prohost.engine.view.panel`) and ``prohost agent status``
(:mod:`prohost.commands.status`) all say a duration, a server or an account in
these same words, so the three never disagree. Text that came from an agent or a
server passes through :func:`clean` before it is shown.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from urllib.parse import urlsplit

from prohost.engine.accounts.book import DEFAULT_ACCOUNT
from prohost.engine.accounts.spend import SpendRow
from prohost.engine.view.snapshot import Snapshot
from prohost.wire.protocol import AccountRow

#: Enough of a run id to find it in the log (``run_3f2a9…``), in characters.
RUN_ID_SHOWN = 10

# Agent output reaches the panel through ``activity`` and ``error``: an escape
# sequence in it would move the cursor under the live display, and a newline
# would break a table row. C0 and C1 controls (and DEL) become spaces.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]+")
_SPACES = re.compile(r"\s{2,}")

_ACCOUNT_MARK = {"ok": "✓", "warning": "⚠", "limited": "⏸"}


def clean(text: str) -> str:
    """``text`` on one line and safe on a terminal: controls become single spaces."""
    return _SPACES.sub(" ", _CONTROL.sub(" ", text)).strip()


def compact_duration(seconds: float) -> str:
    """``45 s``, ``3m12s``, ``1h05m``, ``2d03h``: short and fixed in style, for narrow columns."""
    total = max(0, int(seconds))
    if total < 60:
        return f"{total} s"
    if total < 3600:
        return f"{total // 60}m{total % 60:02d}s"
    if total < 86400:
        return f"{total // 3600}h{total % 3600 // 60:02d}m"
    return f"{total // 86400}d{total % 86400 // 3600:02d}h"


def human_ago(seconds: float) -> str:
    """``12 s``, ``4 minutes``, ``3 hours``, ``2 days``: for "… ago" in sentences."""
    total = max(0, int(seconds))
    for size, unit in ((86400, "day"), (3600, "hour"), (60, "minute")):
        if total >= size:
            count = total // size
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{total} s"


def short_ago(seconds: float) -> str:
    """``12 s``, ``4 min``, ``3 h``, ``2 d``: :func:`human_ago` for a narrow column."""
    total = max(0, int(seconds))
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if total >= size:
            return f"{total // size} {unit}"
    return f"{total} s"


def server_host(url: str) -> str:
    """The host (and a non-default port) of the server URL: the part a person recognises."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port
    except ValueError:
        return url
    if not host:
        return url
    default = {"ws": 80, "http": 80, "wss": 443, "https": 443}.get(parts.scheme)
    return host if port is None or port == default else f"{host}:{port}"


def short_run_id(run_id: str, width: int = RUN_ID_SHOWN) -> str:
    """``run_id`` cut to ``width`` characters, the cut marked with ``…``."""
    return run_id if len(run_id) <= width else run_id[: width - 1] + "…"


def brain_line(snapshot: Snapshot) -> str:
    """``claude 2.1.3 · opus``: the brain, its version and model as far as they are known
    (and an ACP agent's mode: ``acp · gemini-2.5-pro · mode plan``)."""
    brain = snapshot.brain
    if snapshot.brain_version:
        brain += f" {snapshot.brain_version}"
    if snapshot.model:
        brain += f" · {snapshot.model}"
    if snapshot.mode:
        brain += f" · mode {snapshot.mode}"
    return brain


def _clock(epoch: float) -> str:
    """A reset time as the person at this machine reads it: local ``HH:MM``."""
    return time.strftime("%H:%M", time.localtime(epoch))


def account_text(row: AccountRow) -> str:
    """One account for the accounts line: ``work ✓ 41%``, ``personal ⏸ until 20:00``."""
    text = f"{clean(row.name)} {_ACCOUNT_MARK.get(row.state, '?')}"
    if row.state == "limited":
        return text + (f" until {_clock(row.resets_at)}" if row.resets_at is not None else "")
    if row.used_percent is not None:
        text += f" {row.used_percent:.0f}%"
    return text


def accounts_line(accounts: Sequence[AccountRow]) -> str | None:
    """``accounts  work ✓ 41% · personal ⏸ until 20:00``; ``None`` for the one
    implicit default account with nothing to say (no --account given)."""
    if not accounts or (len(accounts) == 1 and accounts[0].name == DEFAULT_ACCOUNT
                        and accounts[0].state == "ok" and accounts[0].used_percent is None):
        return None
    return "accounts  " + " · ".join(account_text(row) for row in accounts)


def tokens_text(count: int) -> str:
    """``950``, ``12.3k``, ``4.1M`` tokens, for narrow places."""
    if count < 1000:
        return str(count)
    if count < 1_000_000:
        return f"{count / 1000:.1f}k"
    return f"{count / 1_000_000:.1f}M"


def cost_text(usd: float) -> str:
    """``$0.0123`` below a dollar, ``$12.34`` above."""
    return f"${usd:.4f}" if usd < 1 else f"${usd:,.2f}"


def _spend_text(row: SpendRow) -> str:
    text = f"{row.runs} run{'s' if row.runs != 1 else ''}"
    tokens = row.input_tokens + row.output_tokens
    if tokens:
        text += f" {tokens_text(tokens)} tokens"
    if row.cost_usd is not None:
        text += f" {cost_text(row.cost_usd)}"
    return text


def spend_line(rows: Sequence[SpendRow]) -> str | None:
    """``today  work 3 runs 12.3k tokens $0.42 · personal 1 run 2.0k tokens`` (each
    account, then ``all`` when there are several); ``None`` before the day's first run."""
    accounts = [row for row in rows if row.account is not None]
    if not accounts:
        return None
    if len(accounts) == 1:
        return f"today  {_spend_text(accounts[0])}"
    parts = [f"{clean(row.account or '')} {_spend_text(row)}" for row in accounts]
    total = next((row for row in rows if row.account is None), None)
    if total is not None:
        parts.append(f"all {_spend_text(total)}")
    return "today  " + " · ".join(parts)


def waiting_reports_text(count: int, since: float | None, now: float) -> str | None:
    """``2 reports wait for the server (the oldest run finished 3 hours ago)``; None
    when none waits. Said the same way by the panel and ``agent status``."""
    if count <= 0:
        return None
    text = f"{count} report{'s' if count != 1 else ''} wait{'' if count != 1 else 's'} " \
        "for the server"
    if since is not None:
        text += f" (the oldest run finished {human_ago(now - since)} ago)"
    return text
