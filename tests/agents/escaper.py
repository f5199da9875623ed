"""An agent that leaves a process behind outside its group, holding its pipes.

    escaper.py PIDFILE

Starts a child that moves to a session of its own (so no signal to the agent's
group reaches it) and sleeps, keeping the agent's stdout and stderr open. Once the
child has left the group, writes its pid to PIDFILE, prints "escaped" and exits 0.
"""

import os
import subprocess
import sys

pidfile = sys.argv[1]
left_r, left_w = os.pipe()
child = subprocess.Popen(
    [sys.executable, "-c",
     "import os, sys, time; os.setsid(); os.write(int(sys.argv[1]), b'x'); time.sleep(600)",
     str(left_w)],
    pass_fds=[left_w],
)
os.close(left_w)
os.read(left_r, 1)  # the child is in its own session now
with open(pidfile + ".tmp", "w") as file:
    file.write(str(child.pid))
os.replace(pidfile + ".tmp", pidfile)
print("escaped", flush=True)
