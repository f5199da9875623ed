"""An agent whose process tree resists SIGTERM, announced to the test's Gate.

    stubborn_tree.py PORT PIDFILE [--leader-ignores-term]

Starts a grandchild that ignores SIGTERM and sleeps, writes "<own pid> <grandchild
pid>" to PIDFILE (atomically), reads the prompt, then says ``start <run id> <pid>`` to
127.0.0.1:PORT (the protocol of tests/kits/harness.py's Gate) and sleeps until killed, whatever
the test says or whether it goes away. The agent itself dies on SIGTERM unless
``--leader-ignores-term``; the grandchild only ever dies by SIGKILL.
"""

import os
import signal
import subprocess
import sys
import time

from gate_client import announce

port, pidfile = int(sys.argv[1]), sys.argv[2]
leader_ignores_term = "--leader-ignores-term" in sys.argv[3:]

# An ignored signal stays ignored across exec, so the grandchild ignores SIGTERM
# from its first instruction: no window in which a SIGTERM would still kill it.
signal.signal(signal.SIGTERM, signal.SIG_IGN)
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
if not leader_ignores_term:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

with open(pidfile + ".tmp", "w") as file:
    file.write(f"{os.getpid()} {grandchild.pid}")
os.replace(pidfile + ".tmp", pidfile)

sys.stdin.read()
conn = announce(port)
while conn.recv(4096):
    pass
time.sleep(600)
