"""The soak's stand-in agent: what the harness runs (Claude brain) for every run.

agent.py --starts FILE --sleeps FILE --refusals FILE --hold FILE --marker TOKEN [claude flags]

It speaks just enough of Claude Code's ``-p --output-format stream-json`` for the
harness's Claude brain, so that usage limits can be part of the soak (only a brain
that reads the CLI's output learns an account's limit, docs/protocol.md §12):

1. While the file ``limit`` in its account folder (``CLAUDE_CONFIG_DIR``) holds a
   reset epoch still in the future, it refuses the run the way the CLI does at its
   usage limit (the synthetic ``rate_limit`` message, a ``rate_limit_event`` with
   ``"status":"rejected"`` and that ``resetsAt``, a failed result, exit 1), after
   appending ``<run_id> <pid> <time> <account>`` to ``--refusals``. A refused
   attempt did no work, so it is not a start: the harness may run the same run on
   the other account afterwards (§12 "failing over") without running it twice.
2. Otherwise it appends one line ``<run_id> <pid> <time>`` to ``--starts`` (O_APPEND,
   one write per start), so "run twice" is counted from the agent's side, whatever
   the harness or the server believe.
3. While the file ``--hold`` exists it waits (the soak's opening burst, which fills
   the harness's queue on purpose; the soak removes the file).
4. Reads the prompt from stdin, sleeps the plan's time for this run (``--sleeps``,
   written by the soak from the plan), and prints a result whose text is a reply
   derived from the run id, in the session it was asked to ``--resume`` (or a new one).

A SIGTERM ends it :data:`TERM_WIND_DOWN_S` later, not at once, as a real CLI
saving its session.

``--marker`` is only there to be found: the soak scans /proc for command lines
that carry it to count agent processes left behind. For ``--self-check`` the
sleeps file lists runs whose work this agent starts twice (a second copy of
itself, which records its own start): a broken promise the soak must catch.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from soaklib.plan import expected_reply

#: Set in the second copy of a run started twice on purpose (self-check).
COPY_ENV = "SOAK_AGENT_COPY"
#: How often a held agent looks at the hold file again (s).
HOLD_POLL_S = 0.02
#: How long the agent takes to exit after a SIGTERM (s), as a real CLI saving its
#: session does: a cancel's stop then lasts long enough for a drain, a second
#: signal or a kill -9 to land in it (issue 37).
TERM_WIND_DOWN_S = 0.3


def _wind_down(signum: int, frame: object) -> None:
    time.sleep(TERM_WIND_DOWN_S)
    os._exit(128 + signum)


def append_line(path: str, line: str) -> None:
    """One line in one write to a file opened O_APPEND: lines from agents running at
    once never interleave, and a kill -9 loses no earlier line."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def limited_until() -> int | None:
    """The reset epoch of this account's limit while it lasts, else None."""
    folder = os.environ.get("CLAUDE_CONFIG_DIR")
    if not folder:
        return None
    try:
        epoch = int(Path(folder, "limit").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return epoch if epoch > time.time() else None


def refuse(session_id: str, epoch: int) -> int:
    """The CLI at its usage limit: what Claude Code prints (see the fake CLI in
    tests/agents/fake_claude.py for where each shape comes from), exit 1."""
    moment = time.gmtime(epoch)
    clock = f"{moment.tm_hour % 12 or 12}:{moment.tm_min:02d}"
    text = f"You've hit your limit · resets {clock}{'am' if moment.tm_hour < 12 else 'pm'} (UTC)"
    emit({"type": "system", "subtype": "init", "session_id": session_id, "model": "soak"})
    # The event first: its exact resetsAt then beats the minute-rounded text.
    emit({"type": "rate_limit_event", "session_id": session_id,
          "rate_limit_info": {"status": "rejected", "resetsAt": epoch,
                              "rateLimitType": "five_hour"}})
    emit({"type": "assistant", "error": "rate_limit", "session_id": session_id,
          "parent_tool_use_id": None,
          "message": {"model": "<synthetic>", "role": "assistant",
                      "content": [{"type": "text", "text": text}]}})
    emit({"type": "result", "subtype": "success", "is_error": True, "result": text,
          "session_id": session_id, "num_turns": 0})
    return 1


def main() -> int:
    signal.signal(signal.SIGTERM, _wind_down)
    parser = argparse.ArgumentParser()
    parser.add_argument("--starts", required=True)
    parser.add_argument("--sleeps", required=True)
    parser.add_argument("--refusals", required=True)
    parser.add_argument("--hold", required=True)
    parser.add_argument("--marker", required=True)
    parser.add_argument("--resume", default=None)
    # The Claude brain's own flags (-p, --output-format, --verbose, ...): accepted.
    args, _ = parser.parse_known_args()
    run_id = os.environ.get("PROHOST_RUN_ID", "")
    if not run_id:
        print("soak agent: PROHOST_RUN_ID is not set (run me from the harness)",
              file=sys.stderr)
        return 2
    session_id = args.resume or str(uuid.uuid4())
    until = limited_until()
    if until is not None and not os.environ.get(COPY_ENV):
        account = Path(os.environ.get("CLAUDE_CONFIG_DIR", "")).name
        append_line(args.refusals, f"{run_id} {os.getpid()} {time.time():.6f} {account}\n")
        return refuse(session_id, until)
    append_line(args.starts, f"{run_id} {os.getpid()} {time.time():.6f}\n")
    if os.environ.get(COPY_ENV):
        return 0
    while os.path.exists(args.hold):
        time.sleep(HOLD_POLL_S)
    with open(args.sleeps, encoding="utf-8") as file:
        table = json.load(file)
    sys.stdin.buffer.read()  # the prompt; the harness closes stdin after writing it
    if run_id in table["twice"]:
        subprocess.run([sys.executable, *sys.argv], env={**os.environ, COPY_ENV: "1"},
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=False)
    time.sleep(table["sleeps"].get(run_id, 0) / 1000)
    reply = expected_reply(run_id)
    emit({"type": "system", "subtype": "init", "session_id": session_id, "model": "soak"})
    emit({"type": "assistant", "session_id": session_id, "parent_tool_use_id": None,
          "message": {"model": "soak", "role": "assistant",
                      "content": [{"type": "text", "text": reply}]}})
    emit({"type": "result", "subtype": "success", "is_error": False, "result": reply,
          "session_id": session_id, "num_turns": 1})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
