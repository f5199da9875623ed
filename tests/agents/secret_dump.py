"""Records its argv and whole environment, then becomes the agent named by its arguments.

``secret_dump.py AGENT [ARGS...]``: appends one JSON line ``{"argv", "env"}`` to the
file named by ``SECRET_DUMP``, then ``execv``s ``AGENT ARGS...`` (so the agent keeps
the same process, environment and arguments). For tests that look for secrets in
what the harness hands its children.
"""

import json
import os
import sys

with open(os.environ["SECRET_DUMP"], "a", encoding="utf-8") as dump:
    dump.write(json.dumps({"argv": sys.argv, "env": dict(os.environ)}) + "\n")
os.execv(sys.argv[1], sys.argv[1:])
