"""How long the harness keeps what it keeps, and how often it clears the rest: every
retention period and its schedule, in one place.

===========================  ==============  ===================================
What                         Kept            Cleared by
===========================  ==============  ===================================
a reported run's body and    7 days          the ledger's prune, daily
outcome (§7)                 (KEEP_RUNS_S)   (supervisor/upkeep.py)
a reported run's tombstone   30 days         the same prune
(its id: a redelivery is
answered 204, never run)
a run's stderr tail          7 days          the same daily pass
(``agent runs --show``)
a report the retry window    7 days after    the outbox, when it next tries
could not settle (§7)        the run ended   (report/outbox.py)
a conversation's worktrees   14 days idle    the daily pass, and ``agent gc``
and folders                                  (its default ``--older-than``)
a conversation's agent       14 days with    the daily pass
folders where it has no      no run (the     (supervisor/upkeep.py); with
worktrees (without           ledger; or      worktrees, they go with those
``--repos``): its CLI and    their last
ACP agents' folders          write)
===========================  ==============  ===================================

A run's stderr tail goes with its body, and a report is given up when its body
would be emptied: the three are one period, :data:`KEEP_RUNS_S`.
"""

from __future__ import annotations

DAY_S = 86400.0

#: A reported run's body, outcome and stderr tail are kept this long (s), and an
#: unsettled report is posted again for this long after its run finished.
KEEP_RUNS_S = 7 * DAY_S
#: A reported run's tombstone (run id, state, when reported) is kept this long (s),
#: so a late redelivery is still answered 204 and never run twice.
KEEP_TOMBSTONES_S = 30 * DAY_S
#: A conversation idle this long (s) has its worktrees and folders collected; one
#: without worktrees, its agent folders (CLI and ACP) once it has had no run for it.
IDLE_LANE_S = 14 * DAY_S
#: The harness clears what is past its period this often (s): the ledger, the stderr
#: tails and idle conversations, each once a day.
CLEAR_EVERY_S = DAY_S
