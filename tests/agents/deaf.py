"""A gated agent (see gated.py) that ignores SIGTERM, so a stop must SIGKILL it, and
that has done its work before it says ``start``.

    deaf.py PORT

Before it says ``start <run id> <pid>`` to 127.0.0.1:PORT it commits a file named
after the run (``work-<run id>.txt``) in the first checkout of $PROHOST_RUN_REPOS,
if the run has any. Then it waits for ``reply TEXT`` (prints TEXT, exits 0) or
``exit N``; a Gate that goes away means exit 3.
"""

import os
import signal
import subprocess
import sys

from gate_client import announce, obey

signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
signal.signal(signal.SIGPIPE, signal.SIG_IGN)
sys.stdin.read()
run_id = os.environ.get("PROHOST_RUN_ID", "run")
folder = os.environ.get("PROHOST_RUN_REPOS")
if folder:
    env = {name: value for name, value in os.environ.items() if not name.startswith("GIT_")}
    env.update(GIT_AUTHOR_NAME="agent", GIT_AUTHOR_EMAIL="agent@example.com",
               GIT_COMMITTER_NAME="agent", GIT_COMMITTER_EMAIL="agent@example.com")
    # Hidden entries are the harness's (the conversation's own repositories).
    checkout = next(path for name in sorted(os.listdir(folder))
                    if not name.startswith(".")
                    and os.path.isdir(path := os.path.join(folder, name)))
    with open(os.path.join(checkout, f"work-{run_id}.txt"), "w") as file:
        file.write("done\n")
    for args in (["add", "-A"], ["commit", "-qm", "agent work"]):
        done = subprocess.run(["git", "-C", checkout, *args], env=env, capture_output=True,
                              text=True)
        if done.returncode:
            sys.exit(f"git {args[0]} failed: {done.stderr.strip()}")
obey(announce(int(sys.argv[1])))
