"""An agent whose child ignores SIGTERM and would outlive it.

    stubborn.py PIDFILE [--then sleep|print|exit]

Starts a grandchild that ignores SIGTERM and sleeps, writes the grandchild's pid
to PIDFILE, prints "ready", then sleeps (the default), prints a dot every 50 ms
(so it is never idle), or exits 0 at once.
"""

import os
import signal
import subprocess
import sys
import time

pidfile = sys.argv[1]
then = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--then" else "sleep"

# An ignored signal stays ignored across exec, so the grandchild ignores SIGTERM
# from its first instruction: no window in which a SIGTERM would still kill it.
signal.signal(signal.SIGTERM, signal.SIG_IGN)
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
signal.signal(signal.SIGTERM, signal.SIG_DFL)

with open(pidfile + ".tmp", "w") as file:
    file.write(str(grandchild.pid))
os.replace(pidfile + ".tmp", pidfile)
print("ready", flush=True)

if then == "exit":
    sys.exit(0)
if then == "print":
    while True:
        print(".", flush=True)
        time.sleep(0.05)
time.sleep(600)
