"""The change notice counts its notices, so a waiter that looked at the state, did
other awaiting work and only then waits does not miss a notice made in between
(the status file lost one that way for up to 5 s: issue 31, point 8).

Driven by trio's scheduler alone: ``wait_all_tasks_blocked`` says every task got
as far as it can, so "it is still waiting" is a fact, not a timeout.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from prohost.engine.changes import Changes


class Waiter:
    """One task in ``wait_since(count)`` (or ``wait()``, count ``None``)."""

    def __init__(self, changes: Changes, count: int | None) -> None:
        self.changes = changes
        self.count = count
        self.returned = False

    async def run(self) -> None:
        if self.count is None:
            await self.changes.wait()
        else:
            await self.changes.wait_since(self.count)
        self.returned = True


async def settle() -> None:
    """Until every task is blocked: each waiter has returned or is waiting."""
    await trio.testing.wait_all_tasks_blocked()


async def test_a_notice_made_before_wait_since_is_seen() -> None:
    changes = Changes()
    count = changes.seen()
    # The caller looks at the state, then does awaiting work; a notice meanwhile:
    await trio.lowlevel.checkpoint()
    changes.notify()
    await trio.lowlevel.checkpoint()
    async with trio.open_nursery() as nursery:
        waiter = Waiter(changes, count)
        nursery.start_soon(waiter.run)
        await settle()
        assert waiter.returned  # no further notice needed
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("how", ["wait_since the current count", "wait"])
async def test_a_waiter_waits_for_the_next_notice(how: str) -> None:
    changes = Changes()
    changes.notify()
    changes.notify()  # earlier notices: accounted for by the count; unseen by wait()
    async with trio.open_nursery() as nursery:
        waiter = Waiter(changes, changes.seen() if how != "wait" else None)
        nursery.start_soon(waiter.run)
        await settle()
        assert not waiter.returned
        changes.notify()
        await settle()
        assert waiter.returned


async def test_one_notice_wakes_every_waiter_and_stale_counts_return_at_once() -> None:
    changes = Changes()
    before = changes.seen()
    changes.notify()
    now = changes.seen()
    async with trio.open_nursery() as nursery:
        waiting = [Waiter(changes, now) for _ in range(5)] + [Waiter(changes, None)]
        stale = [Waiter(changes, before) for _ in range(3)]
        for waiter in waiting + stale:
            nursery.start_soon(waiter.run)
        await settle()
        assert all(waiter.returned for waiter in stale)
        assert not any(waiter.returned for waiter in waiting)
        changes.notify()
        await settle()
        assert all(waiter.returned for waiter in waiting)
        # The count moved on: the same count now returns at once, for anyone.
        late = Waiter(changes, now)
        nursery.start_soon(late.run)
        await settle()
        assert late.returned


async def test_a_cancelled_wait_since_consumes_nothing() -> None:
    changes = Changes()
    count = changes.seen()
    changes.notify()
    with trio.CancelScope() as scope:
        scope.cancel()
        await changes.wait_since(count)  # a checkpoint even when a notice came
    assert scope.cancelled_caught
    async with trio.open_nursery() as nursery:
        waiter = Waiter(changes, count)
        nursery.start_soon(waiter.run)
        await settle()
        assert waiter.returned  # the notice is still there for the same count
        nursery.cancel_scope.cancel()


async def test_a_count_ahead_of_the_notices_is_refused() -> None:
    changes = Changes()
    changes.notify()
    with pytest.raises(ValueError, match="ahead"):
        await changes.wait_since(2)  # not a count seen() gave: it would wait wrongly
