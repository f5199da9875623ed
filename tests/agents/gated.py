"""A fake agent the test controls over a loopback socket.

It connects to 127.0.0.1:<port> (argv[1]), says ``start <run id> <pid>``, and waits
for one line from the test: ``reply TEXT`` prints TEXT and exits 0, ``exit N``
writes a line to stderr and exits N. If the test goes away, it exits 3.
"""

import os
import socket
import sys

prompt = sys.stdin.read()
run_id = os.environ.get("PROHOST_RUN_ID", "?")
conn = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
conn.sendall(f"start {run_id} {os.getpid()}\n".encode())
reader = conn.makefile("r", encoding="utf-8")
line = reader.readline().rstrip("\n")
if line.startswith("reply "):
    print(line[len("reply ") :])
    sys.exit(0)
if line.startswith("exit "):
    print("the gate told me to fail", file=sys.stderr)
    sys.exit(int(line[len("exit ") :]))
sys.exit(3)
