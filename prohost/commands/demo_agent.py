"""The small agent `prohost demo` runs: reads the prompt, works briefly, answers.

It stands in for `claude -p` so the demo needs no login and no network. It prints
progress to stderr (which keeps the idle timer fed, as a real agent's output does)
and its answer to stdout, which the plain brain sends back as the reply.
"""

from __future__ import annotations

import os
import random
import sys
import time


def _request_of(prompt: str) -> str:
    """The first line of the request section, wherever the prompt puts it, without
    the ``>`` the harness quotes the chat's words with."""
    lines = prompt.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("The request") and index + 1 < len(lines):
            return lines[index + 1].removeprefix(">").strip()
    return next((line.strip() for line in lines if line.strip()), "")


def main() -> int:
    prompt = sys.stdin.read()
    request = _request_of(prompt)
    run_id = os.environ.get("PROHOST_RUN_ID", "?")
    work_s = random.uniform(0.5, 2.5)
    steps = 4
    for step in range(1, steps + 1):
        print(f"[demo agent {run_id}] step {step}/{steps}", file=sys.stderr, flush=True)
        time.sleep(work_s / steps)
    print(f"Done after {work_s:.1f} s of pretend work. You asked: {request[:120]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
