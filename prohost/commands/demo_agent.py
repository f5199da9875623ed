"""The small agent `prohost demo` runs: reads the prompt, works briefly, answers.

It stands in for `claude -p` so the demo needs no login and no network. It prints
progress to stderr (which keeps the idle timer fed, as a real agent's output does)
and its answer to stdout, which the plain brain sends back as the reply.

In each private worktree the harness gives its conversation (``PROHOST_RUN_REPOS``,
with ``--repos``) it notes the request in ``notes.md`` and commits that, and leaves
a scratch file uncommitted: what a report's ``changes`` then shows (PROTOCOL.md §7).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

#: Who the stand-in's commits are by.
AUTHOR = {"GIT_AUTHOR_NAME": "prohost demo agent", "GIT_AUTHOR_EMAIL": "demo@prohost.invalid",
          "GIT_COMMITTER_NAME": "prohost demo agent",
          "GIT_COMMITTER_EMAIL": "demo@prohost.invalid"}


def _request_of(prompt: str) -> str:
    """The first line of the request section, wherever the prompt puts it, without
    the ``>`` the harness quotes the chat's words with."""
    lines = prompt.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("The request") and index + 1 < len(lines):
            return lines[index + 1].removeprefix(">").strip()
    return next((line.strip() for line in lines if line.strip()), "")


def _edit_checkouts(run_id: str, request: str) -> int:
    """Note the request in every checkout of the lane and commit it; leave a scratch
    file beside it uncommitted. How many checkouts were edited."""
    folder = os.environ.get("PROHOST_RUN_REPOS")
    if not folder:
        return 0
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("GIT_")} | AUTHOR
    edited = 0
    for checkout in sorted(Path(folder).iterdir()):
        if not (checkout / ".git").exists():
            continue
        with (checkout / "notes.md").open("a") as notes:
            notes.write(f"- {request}\n")
        scratch = checkout / "scratch" / f"{run_id}.txt"
        scratch.parent.mkdir(exist_ok=True)
        scratch.write_text(f"pretend work for: {request}\n")
        for command in (["add", "notes.md"], ["commit", "-q", "-m", f"Note: {request[:60]}"]):
            subprocess.run(["git", "-C", str(checkout), *command], env=env, check=True,
                           stdin=subprocess.DEVNULL, capture_output=True)
        edited += 1
    return edited


def main() -> int:
    prompt = sys.stdin.read()
    request = _request_of(prompt)
    run_id = os.environ.get("PROHOST_RUN_ID", "?")
    work_s = random.uniform(0.5, 2.5)
    steps = 4
    for step in range(1, steps + 1):
        print(f"[demo agent {run_id}] step {step}/{steps}", file=sys.stderr, flush=True)
        time.sleep(work_s / steps)
    edited = _edit_checkouts(run_id, request)
    where = f", noted in {edited} checkout(s)" if edited else ""
    print(f"Done ({work_s:.1f} s of pretend work{where}): {request[:120]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
