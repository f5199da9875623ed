"""``--dry-run``: the part the composition root puts where the ledger's admission
goes. Deliveries are classified and acked as usual (§3), and logged; nothing is
recorded, queued, run or reported, so a dry run needs no ledger, no lock and no
runner, and writes nothing at all. A redelivery within one dry run is answered
200 from memory.
"""

from __future__ import annotations

import logging

from prohost.engine import lognames
from prohost.engine.supervisor.admission import AdmissionPolicy, Intake
from prohost.engine.supervisor.runqueue import RunQueue
from prohost.wire import intake
from prohost.wire.runs import AgentRun

log = logging.getLogger(lognames.HARNESS)


class DryRun(Intake):
    """Answers deliveries from memory and runs nothing (``--dry-run``)."""

    def __init__(self, *, secret: str, policy: AdmissionPolicy, queue: RunQueue) -> None:
        super().__init__(secret=secret, policy=policy, queue=queue)
        #: The run ids answered so far (there is no ledger to ask).
        self.seen: set[str] = set()

    async def admit(self, run: AgentRun, body: str, *,
                    refusal: str | None = None) -> tuple[int, str]:
        """200 for a run seen before, else the 503 ``refusal`` (a drain), else 200
        "accepted (dry run)" with what would have run logged. Cancelled: nothing to
        undo."""
        if run.run_id in self.seen:
            return intake.ACCEPTED, "already accepted"
        if refusal is not None:
            return intake.DRAINING, refusal
        self.seen.add(run.run_id)
        log.info("dry run: would run %s on %s: %r", run.run_id, run.lane, run.text[:80])
        return intake.ACCEPTED, "accepted (dry run)"
