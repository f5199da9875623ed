"""Tries to write, read and commit where it is told, and says how each went.

``prober.py OP...``: each OP is ``KIND:NAME:PATH``; ``$VAR`` in PATH is expanded
from the environment (``$PROHOST_RUN_REPOS``, ``$TMPDIR``). Prints one line
``NAME=RESULT`` per OP, in order, where RESULT is ``ok`` or the errno's name
(``EACCES``) or ``failed`` (a git commit that did not work). Kinds:

- ``write``: append a line to the file PATH (created if missing);
- ``read``: read the file PATH, or list the folder PATH;
- ``commit``: ``git add -A`` and ``git commit`` in the checkout PATH;
- ``child``: the same write, done by a child process of this one (so by the
  agent's grandchild when the agent is this script, or a tool's when a fake CLI
  runs it).

For confinement tests (docs/protocol.md §13): the results are the agent's own errors,
as a confined agent would meet them.
"""

import errno
import os
import subprocess
import sys


def write(path: str) -> str:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("written by a confined run\n")
    return "ok"


def read(path: str) -> str:
    if os.path.isdir(path):
        # An empty folder in a hidden one's place shows nothing of it.
        return "ok" if os.listdir(path) else "empty"
    else:
        with open(path, "rb") as handle:
            handle.read()
    return "ok"


def commit(path: str) -> str:
    with open(os.path.join(path, "from-the-agent.txt"), "a", encoding="utf-8") as handle:
        handle.write("a change the agent commits\n")
    for args in (["add", "-A"], ["commit", "-q", "-m", "the agent's commit"]):
        done = subprocess.run(["git", "-C", path, *args], capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines() or ["?"]
            sys.stderr.write(f"git {args[0]}: {lines[-1]}\n")
            return "failed"
    return "ok"


def child(path: str) -> str:
    done = subprocess.run([sys.executable, __file__, f"write:child:{path}"],
                          capture_output=True, text=True, check=False)
    return done.stdout.strip().partition("=")[2] or "failed"


KINDS = {"write": write, "read": read, "commit": commit, "child": child}


def main() -> None:
    for op in sys.argv[1:]:
        kind, name, path = op.split(":", 2)
        try:
            result = KINDS[kind](os.path.expandvars(path))
        except OSError as exc:
            result = errno.errorcode.get(exc.errno or 0, "failed")
        print(f"{name}={result}", flush=True)


if __name__ == "__main__":
    main()
