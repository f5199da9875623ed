"""The ledger's rows beside the runs: each lane's agent session (per account), the
account each lane last used, accounts remembered at their usage limit, and a
session's running usage totals (docs/protocol.md §7, §12). See :mod:`prohost.engine.ledger`.
"""

from __future__ import annotations

import sqlite3

from prohost.engine.accounts.book import DEFAULT_ACCOUNT
from prohost.engine.ledger.served import ServedCommit


class SessionRows(ServedCommit):
    """The session and account tables of :class:`prohost.engine.ledger.Ledger`."""

    # -- accounts (docs/protocol.md §12) -------------------------------------------------

    def account_session(self, lane: str, account: str) -> str | None:
        """The session the lane's last turn on ``account`` ended with, if any."""
        with self._locked() as conn:
            return _session_on(conn, lane, account)

    def lane_account(self, lane: str) -> str | None:
        """The account the lane's last turn used, if any."""
        with self._locked() as conn:
            found = conn.execute(
                "SELECT account FROM lane_accounts WHERE lane = ?", (lane,)).fetchone()
        return None if found is None else str(found[0])

    def save_turn(
        self, lane: str, account: str, session_id: str | None, now: float, *,
        durable: bool = True, totals: str | None = None,
    ) -> None:
        """Remember the session the lane's turn on ``account`` ended with (``None``
        forgets it) and that ``account`` is the lane's account now, in one step;
        with ``totals`` (a §7 ``usage`` object as JSON), the session's running totals
        as its CLI reported them (Codex), for the next turn's own figures.

        The harness passes ``durable=False``, just before the turn's ``mark_finished``,
        as every step that rides the next commit (see the module docstring).
        """

        def write(conn: sqlite3.Connection) -> None:
            if account == DEFAULT_ACCOUNT:
                # The default account's sessions stay where they always were.
                _store_session(conn, lane, session_id, now)
            elif session_id is None:
                conn.execute("DELETE FROM account_sessions WHERE lane = ? AND account = ?",
                             (lane, account))
            else:
                conn.execute(
                    "INSERT INTO account_sessions (lane, account, session_id, updated_at) "
                    "VALUES (?, ?, ?, ?) ON CONFLICT (lane, account) DO UPDATE SET "
                    "session_id = excluded.session_id, updated_at = excluded.updated_at",
                    (lane, account, session_id, now),
                )
            conn.execute(
                "INSERT INTO lane_accounts (lane, account, updated_at) VALUES (?, ?, ?) "
                "ON CONFLICT (lane) DO UPDATE SET "
                "account = excluded.account, updated_at = excluded.updated_at",
                (lane, account, now),
            )
            if session_id is not None and totals is not None:
                conn.execute(
                    "INSERT INTO session_usage (session_id, totals, updated_at) "
                    "VALUES (?, ?, ?) ON CONFLICT (session_id) DO UPDATE SET "
                    "totals = excluded.totals, updated_at = excluded.updated_at",
                    (session_id, totals, now))

        self._write(write, what="save_turn", durable=durable)

    def flag_earlier_turns(self, lane: str, now: float) -> None:
        """A turn of ``lane`` ended with its harness (a ``kill -9``, a crash) and its
        CLI's running totals were never read: whatever session it went on with,
        the next turn's difference holds its tokens too, so each of the lane's
        sessions' totals says ``includes_earlier_turns`` (§7) until a turn saves
        new ones (issue 37)."""

        def write(conn: sqlite3.Connection) -> None:
            sessions = conn.execute(
                "SELECT session_id FROM sessions WHERE lane = ? "
                "UNION SELECT session_id FROM account_sessions WHERE lane = ?",
                (lane, lane)).fetchall()
            for (session_id,) in sessions:
                conn.execute(
                    "INSERT INTO session_usage (session_id, totals, updated_at) "
                    "VALUES (?, '{\"includes_earlier_turns\": true}', ?) "
                    "ON CONFLICT (session_id) DO UPDATE SET totals = json_set("
                    "CASE WHEN json_valid(session_usage.totals) THEN session_usage.totals "
                    "ELSE '{}' END, '$.includes_earlier_turns', json('true')), "
                    "updated_at = excluded.updated_at",
                    (session_id, now))

        self._write(write, what="flag_earlier_turns")

    def session_totals(self, session_id: str) -> str | None:
        """The running totals (JSON) ``session_id`` had reached after its last turn,
        if its CLI reports them and the ledger has them."""
        with self._locked() as conn:
            found = conn.execute("SELECT totals FROM session_usage WHERE session_id = ?",
                                 (session_id,)).fetchone()
        return None if found is None else str(found[0])

    def account_limits(self) -> dict[str, float]:
        """Every account remembered as limited, and until when (epoch s)."""
        with self._locked() as conn:
            return {str(name): float(until) for name, until in conn.execute(
                "SELECT account, limited_until FROM account_limits")}

    def finished_since(self, since: float) -> list[tuple[float, str]]:
        """``(finished_at, outcome JSON)`` of every run finished at or after ``since``
        (epoch s), reported or not: what today's spend is counted from at start."""
        with self._locked() as conn:
            return [(float(at), str(outcome)) for at, outcome in conn.execute(
                "SELECT finished_at, outcome FROM runs WHERE finished_at >= ? "
                "AND outcome IS NOT NULL", (since,))]

    def lanes_last_used(self) -> dict[str, float]:
        """Each lane the ledger knows, and when a run of it was last accepted,
        started or finished or its turn saved (epoch s): how long its conversation
        has been idle (the daily collection of its agent folders). A lane whose
        runs were pruned is known by its saved turns, which are never pruned."""
        with self._locked() as conn:
            return {str(lane): float(at) for lane, at in conn.execute(
                "SELECT lane, MAX(at) FROM ("
                " SELECT lane, MAX(accepted_at, COALESCE(started_at, 0),"
                "  COALESCE(finished_at, 0)) AS at FROM runs WHERE lane != ''"
                " UNION ALL SELECT lane, updated_at FROM lane_accounts"
                " UNION ALL SELECT lane, updated_at FROM sessions"
                " UNION ALL SELECT lane, updated_at FROM account_sessions"
                ") GROUP BY lane")}

    def save_account_limits(self, limits: dict[str, float]) -> None:
        """Replace the remembered limits with ``limits`` (account → until, epoch s)."""

        def write(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM account_limits")
            conn.executemany(
                "INSERT INTO account_limits (account, limited_until) VALUES (?, ?)",
                sorted(limits.items()),
            )

        self._write(write, what="save_account_limits")


def _session_on(conn: sqlite3.Connection, lane: str, account: str) -> str | None:
    """The session the lane's last turn on ``account`` ended with, if any."""
    if account == DEFAULT_ACCOUNT:
        found = conn.execute(
            "SELECT session_id FROM sessions WHERE lane = ?", (lane,)).fetchone()
    else:
        found = conn.execute(
            "SELECT session_id FROM account_sessions WHERE lane = ? AND account = ?",
            (lane, account)).fetchone()
    return None if found is None else str(found[0])


def _store_session(
    conn: sqlite3.Connection, lane: str, session_id: str | None, now: float
) -> None:
    """Remember (or, with ``None``, forget) the lane's session on the default account."""
    if session_id is None:
        conn.execute("DELETE FROM sessions WHERE lane = ?", (lane,))
    else:
        conn.execute(
            "INSERT INTO sessions (lane, session_id, updated_at) VALUES (?, ?, ?) "
            "ON CONFLICT (lane) DO UPDATE SET "
            "session_id = excluded.session_id, updated_at = excluded.updated_at",
            (lane, session_id, now),
        )
