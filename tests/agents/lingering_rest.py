"""An agent that prints its reply and exits, leaving a child in its process group
that holds the group open after it: the moment between the agent's end and the
harness's (it gives what the agent left SIGTERM and the grace to end).

    lingering_rest.py PORT REPLY

The child ignores SIGTERM; when the harness sends it, the child tells the test's
Gate at 127.0.0.1:PORT ``start <run id>-rest <pid>`` and then waits for its word
(``reply``/``exit``: it exits; a Gate that goes away: it exits too). Its stdout
and stderr are not the agent's, so the agent's pipes end with the agent.
"""

import os
import subprocess
import sys

port, reply = sys.argv[1], sys.argv[2]
sys.stdin.read()

CHILD = """
import os, signal, socket, sys
heard = []
signal.signal(signal.SIGTERM, lambda *_: heard.append(1))
print("armed", flush=True)
while not heard:
    signal.pause()
conn = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
run_id = os.environ.get("PROHOST_RUN_ID", "?")
conn.sendall(f"start {run_id}-rest {os.getpid()}\\n".encode())
conn.makefile("r").readline()
"""

child = subprocess.Popen([sys.executable, "-c", CHILD, port], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
assert child.stdout is not None
if child.stdout.readline() != b"armed\n":
    sys.exit("the child did not arm itself")
print(reply, flush=True)
os._exit(0)
