"""The account book in time: which account a run starts on, and the wait while none can (§12).

:class:`~prohost.engine.accounts.book.AccountBook` is the pure logic and reads no
clock. An :class:`AccountGate`, one per harness and shared by all its runs,
adds what takes time: a run waits for the earliest reset while every account is
limited, up to ``--limit-wait`` counted once for every queued run from when the
last usable account was lost; whatever an attempt learns about its account's
limit is recorded (and saved, so a restart need not find it again), and every
waiting run is woken to ask again. :mod:`prohost.engine.run.runner` asks the gate
before a run starts and when an attempt's account reaches its limit. A drain
(:meth:`AccountGate.turn_away`) ends every wait at once: the run is handed back
like a queued one (§9), instead of holding the drain up to --limit-wait.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from prohost.engine import lognames
from prohost.engine.accounts.book import UNKNOWN_RESET_S, Account, AccountBook
from prohost.engine.accounts.limits import LimitNotice
from prohost.wire.outcomes import all_limited_reason, iso_time
from prohost.wire.runs import Outcome

# The runner's logger: these lines are part of a run's story, and whoever listens to
# "prohost.runner" for it should hear them as before the gate had its own module.
log = logging.getLogger("prohost.runner")
#: The runs logger (:data:`prohost.engine.lognames.RUNS`: a run's
#: progress, turned down to warnings while a panel shows the same).
_progress_log = logging.getLogger(lognames.RUNS)


class Waiter(Protocol):
    """Where a waiting run says until when it waits (its progress, read by its
    heartbeat and the panel): the gate is that field's one writer."""

    waiting_until: float | None


class AccountGate:
    """Lets runs onto an account, holding them while every account is limited."""

    def __init__(
        self,
        book: AccountBook,
        *,
        limit_wait_s: float,
        clock: Callable[[], float],
        on_change: Callable[[], None],
        save_limits: Callable[[dict[str, float]], Awaitable[None]],
    ) -> None:
        """``clock`` gives wall-clock epoch seconds (the book's reset times);
        ``on_change`` is told whenever what status shows changed; ``save_limits``
        writes the book's limits to the ledger (see :meth:`learned`)."""
        self.book = book
        self.limit_wait_s = limit_wait_s
        self.clock = clock
        self._on_change = on_change
        self._save_limits = save_limits
        #: trio time since when every account has been limited (None: one is usable).
        #: Queued runs wait until this plus --limit-wait, however long they queued.
        self._all_limited_since: float | None = None
        #: Set (and replaced) whenever the book learns something.
        self.book_changed = trio.Event()
        #: Once set (a drain), what a run that would wait gets instead.
        self._turned_away: Outcome | None = None

    def turn_away(self, outcome: Outcome) -> None:
        """From now on a run that would wait for an account gets ``outcome`` at once,
        and every run waiting now leaves with it (a drain: §9 hands such runs back
        like queued ones). A run with a usable account still starts. Never undone."""
        self._turned_away = outcome
        self.book_moved()

    async def learned(self, account: Account, notice: LimitNotice | None) -> None:
        """Record what an attempt on ``account`` said about its limit; a change is
        announced (status) and the limits written to the ledger, so a restart does
        not spend a run finding them again.

        Cancelled: as ``save_limits`` (the runner's ledger step: shielded, bounded).
        """
        if notice is not None and notice.state == "limited":
            log.warning("account %s is at its usage limit%s", account.name,
                        "" if notice.resets_at is None
                        else f" until {iso_time(notice.resets_at)}")
        if not self.book.report(account.name, notice, self.clock()):
            return
        self.book_moved()
        await self._save_limits(self.book.limits(self.clock()))

    def book_moved(self) -> None:
        """Wake the runs waiting for an account, and announce the change (status, panel)."""
        self.book_changed.set()
        self.book_changed = trio.Event()
        self._on_change()

    def limit_wait_deadline(self) -> float | None:
        """While every account is limited: the trio time until which queued runs
        wait (§12's ``--limit-wait``, counted from when the last usable account
        was lost); ``None`` while one is usable."""
        if not self.book.all_limited(self.clock()):
            self._all_limited_since = None
            return None
        if self._all_limited_since is None:
            self._all_limited_since = trio.current_time()
        return self._all_limited_since + self.limit_wait_s

    async def wait_for_account(self, run_id: str, progress: Waiter,
                               lane_account: str | None) -> Account | Outcome:
        """The account run ``run_id`` starts on; while none is usable, wait for the
        earliest reset, up to --limit-wait, else the retryable failure §12 names;
        after :meth:`turn_away`, instead of waiting, its outcome. Meanwhile
        ``progress.waiting_until`` says until when (for heartbeats and the panel).
        The run is still ``accepted`` in the ledger meanwhile (or ``started``, when
        its first account reached its limit), so a restart queues (or reports) it.

        Cancelled: nothing to undo; the run stays ``accepted``.
        """
        try:
            while True:
                now = self.clock()
                account = self.book.choose(now, lane_account=lane_account)
                if account is not None:
                    # One is usable: the next time all are limited, the wait starts anew.
                    self.limit_wait_deadline()
                    return account
                reset = self.book.earliest_reset(now)
                deadline = self.limit_wait_deadline()
                if deadline is None:  # the book changed between the two questions
                    continue
                if self._turned_away is not None:
                    log.info("run %s: every account is limited and the harness is "
                             "draining; not waiting for one", run_id)
                    return self._turned_away
                if trio.current_time() >= deadline:
                    reason = all_limited_reason(reset)
                    log.warning("run %s: %s; reporting it retryable (--limit-wait)",
                                run_id, reason)
                    return Outcome.failure(reason, retryable=True)
                until = reset if reset is not None else now + UNKNOWN_RESET_S
                if progress.waiting_until != until:
                    progress.waiting_until = until
                    _progress_log.info("run %s is waiting: %s", run_id,
                                       all_limited_reason(until))
                    self._on_change()
                # Whichever comes first: the reset, the end of the wait, or news.
                with trio.move_on_at(min(deadline, trio.current_time() + max(0.0, until - now))):
                    await self.book_changed.wait()
        finally:
            if progress.waiting_until is not None:
                progress.waiting_until = None
                self._on_change()
