"""A plain agent that works in its private checkouts.

For every checkout in $PROHOST_RUN_REPOS it lists the files there, then leaves an
uncommitted file named after the run. Its reply is JSON: the folder, what it
found, and whether the prompt told it about read-only checkouts.
"""

import json
import os
import sys

prompt = sys.stdin.read()
folder = os.environ.get("PROHOST_RUN_REPOS")
seen = {}
if folder:
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        # Hidden entries are the harness's (the conversation's own repositories).
        if name.startswith(".") or not os.path.isdir(path):
            continue
        seen[name] = sorted(entry for entry in os.listdir(path) if entry != ".git")
        with open(os.path.join(path, f"note-{os.environ['PROHOST_RUN_ID']}.txt"), "w") as file:
            file.write("work in progress\n")
print(json.dumps({"folder": folder, "seen": seen,
                  "read_only_told": "No private checkout could be prepared" in prompt}))
