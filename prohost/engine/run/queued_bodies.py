"""The bodies of queued runs, kept light (docs/protocol.md §3: up to 10,000 queued).

A queued :class:`~prohost.engine.run.heldrun.HeldRun` keeps no parsed body: only the
text it was delivered in, and that only while the queued runs' texts fit a budget.
When the run leaves the queue (to start, or to be reported), :meth:`QueuedBodies.load`
parses that text again, or, past the budget, reads the body back from the ledger,
which has held it, fsync'd, since before the ack. Parsing costs about 20 µs, the
read a worker-thread hop (about 150 µs); 10,000 parsed bodies were most of the
harness's memory (docs/benchmarks.md).

A body that cannot be read back still leaves a run that can be reported: the held
run keeps its completion path, and gets a stand-in body without text.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from prohost.engine import lognames
from prohost.engine.blocking import StepTimedOut
from prohost.engine.ledger import LedgerError
from prohost.engine.run.heldrun import HeldRun
from prohost.wire.runs import AgentRun, BodyError, parse_body

log = logging.getLogger(lognames.HARNESS)

#: Default budget for the texts queued runs keep (characters, about bytes): the
#: bodies of about 4,000 queued runs of 2 KiB.
QUEUED_TEXT_BUDGET_CHARS = 8 * 1024 * 1024

#: Reads a run's body back from the ledger (bounded); ``None``: no such row.
ReadBack = Callable[[str], Awaitable[str | None]]


class QueuedBodies:
    """The budget for queued runs' body texts, and the loading of a body at start."""

    def __init__(self, budget_chars: int = QUEUED_TEXT_BUDGET_CHARS) -> None:
        #: Queued runs keep their body's text while these total at most this many
        #: characters; past it, a body is read back from the ledger.
        self.budget = budget_chars
        #: Characters of body text the queued runs hold now.
        self.chars = 0

    def keep(self, held: HeldRun, text: str) -> None:
        """Make ``held`` light as it is queued: no parsed body (its completion path
        kept), and its body's ``text`` only while the budget allows."""
        if held.body is not None:
            held.completion_path = held.body.completion_path
        held.body = None
        if self.chars + len(text) <= self.budget:
            held.raw = text
            self.chars += len(text)

    def drop(self, held: HeldRun) -> None:
        """Forget ``held``'s body text (parsed, or no longer needed), and its share of
        the budget."""
        if held.raw is not None:
            self.chars -= len(held.raw)
            held.raw = None

    async def load(self, held: HeldRun, read_back: ReadBack) -> str | None:
        """Parse a queued run's body as it leaves the queue; ``None`` once
        ``held.body`` is set from it.

        When the body cannot be read (a disk error, a row gone or changed), the
        reason is logged and returned, and ``held.body`` is a stand-in with the run's
        id, conversation and completion path and no text: enough to report the run,
        never to run it.

        Cancelled: as ``read_back`` (a read: abandoning it leaves nothing half done);
        the body is then not loaded.
        """
        if held.body is not None:
            return None
        body = held.raw
        problem: str | None = None
        if body is not None:
            self.drop(held)
        else:
            try:
                body = await read_back(held.run_id)
            except (LedgerError, OSError, StepTimedOut) as exc:
                problem = f"could not read the run back from the ledger: {exc}"
            else:
                if body is None:
                    problem = "the run is no longer in the ledger"
        if body is not None:
            try:
                held.body = parse_body(body)
                return None
            except BodyError as exc:  # only if the ledger's copy changed since the admission
                problem = f"the run in the ledger cannot be read: {exc}"
        problem = problem or "the run's body is missing"
        if held.completion_path is None:
            raise RuntimeError(f"harness bug: run {held.run_id} was queued without its "
                               "completion path")
        log.error("run %s: %s; reporting it as an internal error", held.run_id, problem)
        held.body = AgentRun(run_id=held.run_id, completion_path=held.completion_path,
                             text="", conversation_id=held.conversation_id)
        return problem
