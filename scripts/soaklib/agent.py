"""The soak's stand-in agent: what the harness runs (plain brain) for every run.

agent.py --starts FILE --sleeps FILE --marker TOKEN

1. Appends one line ``<run_id> <pid> <time>`` to ``--starts`` (O_APPEND, one write
   per start), so "run twice" is counted from the agent's side, whatever the
   harness or the server believe.
2. Reads the prompt from stdin, sleeps the plan's time for this run (``--sleeps``,
   written by the soak from the plan), and prints a reply derived from the run id.

``--marker`` is only there to be found: the soak scans /proc for command lines
that carry it to count agent processes left behind. For ``--self-check`` the
sleeps file lists runs whose work this agent starts twice (a second copy of
itself, which records its own start): a broken promise the soak must catch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from soaklib.plan import expected_reply

#: Set in the second copy of a run started twice on purpose (self-check).
COPY_ENV = "SOAK_AGENT_COPY"


def record_start(path: str, run_id: str) -> None:
    """One line per start, in one write to a file opened O_APPEND: lines from
    agents running at once never interleave, and a kill -9 loses no earlier line."""
    line = f"{run_id} {os.getpid()} {time.time():.6f}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--starts", required=True)
    parser.add_argument("--sleeps", required=True)
    parser.add_argument("--marker", required=True)
    args = parser.parse_args()
    run_id = os.environ.get("PROHOST_RUN_ID", "")
    if not run_id:
        print("soak agent: PROHOST_RUN_ID is not set (run me from the harness)",
              file=sys.stderr)
        return 2
    record_start(args.starts, run_id)
    if os.environ.get(COPY_ENV):
        return 0
    with open(args.sleeps, encoding="utf-8") as file:
        table = json.load(file)
    sys.stdin.buffer.read()  # the prompt; the harness closes stdin after writing it
    if run_id in table["twice"]:
        subprocess.run([sys.executable, *sys.argv], env={**os.environ, COPY_ENV: "1"},
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=False)
    time.sleep(table["sleeps"].get(run_id, 0) / 1000)
    sys.stdout.write(expected_reply(run_id) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
