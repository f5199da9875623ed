"""An ``--exec`` program that never gets to exec its agent: a wrapper whose first
step hangs (a named pipe nobody writes, as a stuck mount would), deaf to SIGTERM.

    hung_before_exec.py PORT FIFO AGENT [ARGS...]

It tells the test's Gate at 127.0.0.1:PORT ``start <run id> <pid>``, then blocks
opening FIFO for reading, and only then would exec AGENT.
"""

import os
import signal
import socket
import sys

port, fifo, *agent = sys.argv[1:]
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
gate = socket.create_connection(("127.0.0.1", int(port)))
gate.sendall(f"start {os.environ.get('PROHOST_RUN_ID', '?')} {os.getpid()}\n".encode())
with open(fifo, "rb"):  # blocks: nobody opens it for writing
    pass
os.execv(agent[0], agent)
