"""The run history ``prohost agent runs`` prints: the ledger's rows, newest first, read
without taking part in the running harness's writes.

A separate read-only connection (``mode=ro``): it never writes, never migrates and
never waits for the harness's group commit, so looking at the history beside a
busy harness costs that harness nothing (WAL lets a reader see the last commit
while a write is under way). A run pruned to its tombstone (§7: body and outcome
gone after a week) is still listed, with what is left of it.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from prohost.engine.ledger.rows import LedgerError
from prohost.wire.runs import conversation_of

#: How long a read waits for a writer that holds the file's lock (ms): a WAL reader
#: rarely waits at all; this only covers a checkpoint's brief exclusive moments.
_READ_BUSY_MS = 2000


@attrs.frozen
class CheckoutHead:
    """Where a run left one checkout (§7 ``changes``): its branch and commit."""

    repo: str
    branch: str | None
    head: str | None


@attrs.frozen
class PastRun:
    """One run as the history shows it; ``None`` where the ledger does not know."""

    run_id: str
    conversation_id: str | None
    #: The ledger's state: accepted, started, finished or reported.
    state: str
    ok: bool | None
    error: str | None
    accepted_at: float
    started_at: float | None
    finished_at: float | None
    duration_ms: int | None
    account: str | None
    cost_usd: float | None
    checkouts: tuple[CheckoutHead, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The object ``agent runs --json`` prints for it (keys as the README lists)."""
        # JSON wants a list where the record keeps a tuple.
        return {**attrs.asdict(self), "checkouts": [attrs.asdict(c) for c in self.checkouts]}


#: Every run id the server sends starts so; a person may leave it out.
RUN_ID_PREFIX = "run_"


def read_history(path: Path, *, limit: int | None = None,
                 run_id: str | None = None, prefix: str | None = None) -> list[PastRun]:
    """The ledger's runs, newest accepted first (at most ``limit``), or only ``run_id``,
    or only those whose id starts with ``prefix`` (or with ``run_`` then ``prefix``:
    the part a person types, as git takes a commit's first digits).

    A missing ledger is an empty history (no harness ever ran on this home). Raises
    :class:`LedgerError` with a message naming the file when it cannot be read.
    """
    if not path.exists():
        return []
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True,
                               timeout=_READ_BUSY_MS / 1000)
    except sqlite3.Error as exc:
        raise LedgerError(f"cannot open the run ledger {path}: {exc}") from None
    try:
        query = ("SELECT run_id, lane, body, state, accepted_at, started_at, finished_at, "
                 "outcome FROM runs")
        params: tuple[Any, ...] = ()
        if run_id is not None:
            query += " WHERE run_id = ?"
            params = (run_id,)
        elif prefix is not None:
            # substr, not LIKE: a typed "_" or "%" is itself, never a wildcard.
            query += " WHERE substr(run_id, 1, ?) = ? OR substr(run_id, 1, ?) = ?"
            params = (len(prefix), prefix, len(RUN_ID_PREFIX + prefix), RUN_ID_PREFIX + prefix)
        query += " ORDER BY seq DESC"
        if limit is not None:
            query += " LIMIT ?"
            params += (limit,)
        try:
            return [_past_run(*values) for values in conn.execute(query, params)]
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot read the run ledger {path}: {exc}") from None
    finally:
        conn.close()


def _past_run(run_id: str, lane: str, body: str, state: str, accepted_at: float,
              started_at: float | None, finished_at: float | None,
              outcome_text: str | None) -> PastRun:
    # Field by field, not Outcome.from_json: that refuses a whole outcome for one bad
    # field (another version's shape, a damaged row), and the row would lose its
    # error and account too (tests/engine/ledger/test_history.py).
    outcome = _json_object(outcome_text)
    usage = outcome.get("usage")
    cost = usage.get("cost_usd") if isinstance(usage, dict) else None
    ok = outcome.get("ok")
    duration = outcome.get("duration_ms")
    return PastRun(
        run_id=run_id,
        conversation_id=_conversation(lane, body),
        state=state,
        ok=ok if isinstance(ok, bool) else None,
        error=_text(outcome.get("error")),
        accepted_at=accepted_at,
        started_at=started_at,
        finished_at=finished_at,
        duration_ms=duration if isinstance(duration, int) else None,
        account=_text(outcome.get("account")),
        cost_usd=float(cost) if isinstance(cost, int | float) else None,
        checkouts=tuple(_checkouts(outcome.get("changes"))),
    )


def _conversation(lane: str, body: str) -> str | None:
    # The lane says it even once the body is pruned (until the tombstone empties it).
    if (from_lane := conversation_of(lane)) is not None:
        return from_lane
    conversation = _json_object(body).get("conversation_id")
    return conversation if isinstance(conversation, str) else None


def _checkouts(changes: Any) -> Iterator[CheckoutHead]:
    # Not shared with view.reporttext.where_text, though it reads the same entries:
    # that one escapes control characters for a terminal, shows only the checkouts
    # that changed and a missing repo as "?"; this one keeps the raw text for --json
    # and every checkout that was read.
    if not isinstance(changes, list):
        return
    for entry in changes:
        if isinstance(entry, dict) and isinstance(entry.get("repo"), str) \
                and "error" not in entry:
            yield CheckoutHead(repo=entry["repo"], branch=_text(entry.get("branch")),
                               head=_text(entry.get("head")))


def _json_object(text: str | None) -> dict[str, Any]:
    # A row is read for people: one unreadable outcome costs its details, not the list.
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None
