"""A gated agent (see gated.py) that outlives its harness until something kills it.

    hardy.py PORT

Like gated.py: reads the prompt, says ``start <run id> <pid>`` to 127.0.0.1:PORT,
then waits for ``reply TEXT`` (prints TEXT, exits 0) or ``exit N``; if the test goes
away it exits 3. Unlike gated.py:

- it ignores SIGHUP and SIGPIPE, and never touches stdout until told to reply, so
  its harness dying (pipes closed, session gone) does not end it;
- before it says ``start`` it waits until the harness's run ledger
  ($PROHOST_HOME/ledger.sqlite3) has recorded a process group for the run. A
  test that kills the harness as soon as the agent says ``start`` therefore knows
  the restarted harness has what it needs to find this agent (docs/protocol.md §7).
  It waits at most 30 s, then says ``start`` anyway (the test checks the ledger).
"""

import os
import signal
import sqlite3
import sys
import time
from pathlib import Path

from gate_client import announce, obey

signal.signal(signal.SIGHUP, signal.SIG_IGN)
signal.signal(signal.SIGPIPE, signal.SIG_IGN)

prompt = sys.stdin.read()
run_id = os.environ.get("PROHOST_RUN_ID", "?")
ledger = Path(os.environ["PROHOST_HOME"]) / "ledger.sqlite3"


def recorded_pgid() -> int | None:
    conn = sqlite3.connect(ledger.as_uri() + "?mode=ro", uri=True, timeout=5)
    try:
        row = conn.execute("SELECT pgid FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    finally:
        conn.close()
    return None if row is None else row[0]


give_up = time.monotonic() + 30
# Recorded at all: a confined agent's own process group is not its PID namespace's
# to name (os.getpgrp() is 0 there), so it cannot compare it with the ledger's.
while recorded_pgid() is None and time.monotonic() < give_up:
    time.sleep(0.02)

obey(announce(int(sys.argv[1])))
