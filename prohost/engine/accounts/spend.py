"""What the agent accounts spent today: runs, tokens and cost per account, from the
``usage`` of each run's outcome (docs/protocol.md §7), for ``agent status`` and the panel.

"Today" is the local calendar day of the machine (what a person reading the panel
means by it); the tally starts again at local midnight. A restart reads the day's
finished runs back from the ledger, so the figures survive it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import attrs

from prohost.engine.accounts.book import DEFAULT_ACCOUNT
from prohost.wire.usage import Usage


@attrs.frozen
class SpendRow:
    """One account's spend today (``account`` is ``None`` for all of them together)."""

    account: str | None
    runs: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    #: ``None`` when no run of the day reported a cost (Codex prints none).
    cost_usd: float | None = None


def day_of(epoch: float) -> str:
    """The local calendar day of ``epoch``, ``YYYY-MM-DD``."""
    return time.strftime("%Y-%m-%d", time.localtime(epoch))


def day_start(epoch: float) -> float:
    """Local midnight before ``epoch`` (epoch s)."""
    parts = time.localtime(epoch)
    return time.mktime((parts.tm_year, parts.tm_mon, parts.tm_mday, 0, 0, 0, 0, 0, -1))


class DailySpend:
    """The day's tally; :meth:`add` each run's outcome as it finishes."""

    def __init__(self) -> None:
        self._day: str | None = None
        self._rows: dict[str, SpendRow] = {}

    def add(self, account: str | None, usage: Usage | object, at: float) -> None:
        """Count one finished run of ``account`` (the default one if ``None``) with
        its ``usage`` at ``at`` (epoch s): a :class:`Usage`, or a §7 ``usage`` object
        as the ledger keeps it (anything not valid is left out)."""
        day = day_of(at)
        if day != self._day:
            if self._day is not None and day < self._day:
                return  # a run of an earlier day (read back from the ledger)
            self._day, self._rows = day, {}
        name = account or DEFAULT_ACCOUNT
        # What is not valid is left out, as in a report.
        used = usage if isinstance(usage, Usage) else Usage.from_json(usage)
        row = self._rows.get(name, SpendRow(name))
        self._rows[name] = SpendRow(
            name, runs=row.runs + 1,
            input_tokens=row.input_tokens + (used.input_tokens or 0),
            output_tokens=row.output_tokens + (used.output_tokens or 0),
            cost_usd=row.cost_usd if used.cost_usd is None
            else (row.cost_usd or 0.0) + used.cost_usd,
        )

    def restore(self, finished: Iterable[tuple[str | None, object, float]],
                now: float) -> None:
        """Count again the runs of today a previous process finished: ``(account,
        usage, finished_at)`` each, as the ledger keeps them."""
        self._day, self._rows = day_of(now), {}
        for account, usage, at in finished:
            if day_of(at) == self._day:
                self.add(account, usage, at)

    def rows(self, now: float) -> list[SpendRow]:
        """Each account's spend today (in the order they first ran), then all of them
        together; none before the day's first run."""
        if self._day != day_of(now) or not self._rows:
            return []
        rows = list(self._rows.values())
        costs = [row.cost_usd for row in rows if row.cost_usd is not None]
        total = SpendRow(None, runs=sum(row.runs for row in rows),
                         input_tokens=sum(row.input_tokens for row in rows),
                         output_tokens=sum(row.output_tokens for row in rows),
                         cost_usd=sum(costs) if costs else None)
        return [*rows, total]
