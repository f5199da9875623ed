"""What is known of a run while it goes on (its :class:`Progress`) and the words
its heartbeat uses while it waits for an account: the run's own facts, read by the
held run and the views, and importing none of them."""

from __future__ import annotations

import time

import attrs

from prohost.engine.agent.reading import Seen


def waiting_activity(until: float) -> str:
    """A waiting run's heartbeat activity: the reset in local time, ``HH:MM``."""
    return f"waiting for an account (resets {time.strftime('%H:%M', time.localtime(until))})"


@attrs.define
class Progress(Seen):
    """What is learnt while a run goes on, readable at any moment (also after a
    cancel: a cancelled run is reported with the session it had): what its agents
    showed of themselves (the :class:`Seen` its agent's output reader writes, in the
    agent room) and what the run itself knows.

    Each field has one writer:

    =================  ==============================================================
    field              written by
    =================  ==============================================================
    ``waiting_until``  the account gate, while the run waits for an account (§12)
    ``preparing``      the runner, while it makes the run's private checkouts (§5.1)
    ``account``        the runner, as it hands the run to an account's attempt
    ``session_id``     the attempt (:func:`prohost.engine.run.execute.execute`), the
                       session it resumes; then the agent's output reader
                       (:class:`~prohost.engine.agent.reading.OutputReader`), the one
                       the agent announced
    ``activity``       the output reader, from the agent's output
    ``model``, ``mode``  the output reader, from the agent's output
    ``attempts``       the attempt, once per spawn tried
    ``last_output``    the attempt as it spawns, then the output reader at every read
    =================  ==============================================================
    """

    #: While the run waits for an account's limit to reset: when (epoch s).
    waiting_until: float | None = None
    #: What the run prepares before its agent can start, for heartbeats.
    preparing: str | None = None
    #: The account the current (or last) attempt runs on (docs/protocol.md §12);
    #: ``None`` until the first attempt.
    account: str | None = None
    #: Spawns tried so far (a fresh retry and a fail-over each count).
    attempts: int = 0
