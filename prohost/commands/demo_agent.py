"""The small agent `prohost demo` runs: reads the prompt, works briefly, answers.

It stands in for `claude -p` so the demo needs no login and no network, and speaks
Claude Code's ``--output-format stream-json`` the way the claude brain reads it: an
``init`` event (its session, resumed with ``--resume``), a pretend tool call and its
result per step of pretend work (which keeps the idle timer fed and shows in the
panel's activity column), and a
``result`` with the reply and **pretend** usage figures (model
``demo-pretend-model``): nothing here costs anything.

In each private worktree the harness gives its conversation (``PROHOST_RUN_REPOS``,
with ``--repos``) it notes the request in ``notes.md`` and commits that, and leaves
a scratch file uncommitted: what a report's ``changes`` then shows (docs/protocol.md §7).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path

#: The model the stand-in says it is: its usage figures are made up.
PRETEND_MODEL = "demo-pretend-model"

#: The pretend tool calls it reports, one per step, as Claude Code names them.
PRETEND_TOOLS: tuple[tuple[str, dict[str, str]], ...] = (
    ("Read", {"file_path": "README.md"}),
    ("Grep", {"pattern": "TODO"}),
    ("Edit", {"file_path": "notes.md"}),
    ("Bash", {"command": "git commit -m 'Note the request'"}),
)

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


def _emit(event: dict[str, object]) -> None:
    print(json.dumps(event, separators=(",", ":")), flush=True)


def _resumed(argv: list[str]) -> str | None:
    for word in argv:
        if word.startswith("--resume="):
            return word.split("=", 1)[1]
    return None


def main() -> int:
    if "--version" in sys.argv:
        print("0.1 (prohost demo stand-in)")
        return 0
    prompt = sys.stdin.read()
    request = _request_of(prompt)
    run_id = os.environ.get("PROHOST_RUN_ID", "?")
    session = _resumed(sys.argv) or str(uuid.uuid4())
    _emit({"type": "system", "subtype": "init", "session_id": session, "model": PRETEND_MODEL,
           "tools": [], "cwd": os.getcwd()})
    work_s = random.uniform(0.5, 2.5)
    steps = len(PRETEND_TOOLS)
    for step, (tool, arguments) in enumerate(PRETEND_TOOLS, 1):
        # A tool call and its result, as Claude Code reports them: the panel's
        # activity column and the run's timeline show each one while it "runs".
        call_id = f"toolu_demo_{step}"
        _emit({"type": "assistant", "session_id": session, "message": {
            "model": PRETEND_MODEL, "role": "assistant",
            "content": [{"type": "text", "text": f"Step {step} of {steps} of pretend work"},
                        {"type": "tool_use", "id": call_id, "name": tool,
                         "input": arguments}]}})
        time.sleep(work_s / steps)  # pretend work: the demo's agent, not a test's wait
        _emit({"type": "user", "session_id": session, "message": {
            "role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id,
                                         "content": "ok (pretend)"}]}})
    _edit_checkouts(run_id, request)
    reply = f"Pretend answer to: {request[:100]}"
    words = len(prompt.split())
    _emit({"type": "result", "subtype": "success", "is_error": False,
           "duration_ms": round(work_s * 1000), "num_turns": steps, "result": reply,
           "session_id": session,
           # Pretend figures, in the CLI's own shape: the demo spends nothing.
           "total_cost_usd": round(words * 0.00002, 6),
           "usage": {"input_tokens": words * 3, "output_tokens": len(reply.split()) * 3,
                     "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
