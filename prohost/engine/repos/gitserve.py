"""The far end of :class:`prohost.engine.repos.gitsession.ConfinedGit`: run inside a
run's confinement (bubblewrap), it runs the harness's git commands one after
another, so that reading what a run left (``changes``, gc) costs one confined
process, not one per git (docs/protocol.md §13).

Run as a script by path (``python -I -S gitserve.py``), so it imports nothing but
the standard library. Each request is one line of JSON on stdin, ``{"argv": [...],
"env": {...}}`` (strings; a lone surrogate stands for a byte of a path that is not
UTF-8, as ``os.fsdecode`` made it); each answer, on stdout, is a line ``<status>
<stdout length> <stderr length>`` then those bytes. End of stdin: it exits. It
has no timeout of its own: the harness kills its whole confinement (its PID
namespace) when a command outlives its bound.
"""

from __future__ import annotations

import json
import subprocess
import sys


def serve() -> int:
    """Answer requests until stdin ends; 0 then."""
    requests, answers = sys.stdin.buffer, sys.stdout.buffer
    while True:
        line = requests.readline()
        if not line:
            return 0
        request = json.loads(line)
        try:
            done = subprocess.run(request["argv"], env=request["env"],
                                  stdin=subprocess.DEVNULL, capture_output=True, check=False)
            status, out, err = done.returncode, done.stdout, done.stderr
        except OSError as exc:
            status, out, err = 127, b"", f"fatal: could not run git: {exc}\n".encode()
        answers.write(b"%d %d %d\n" % (status, len(out), len(err)))
        answers.write(out)
        answers.write(err)
        answers.flush()


if __name__ == "__main__":
    sys.exit(serve())
