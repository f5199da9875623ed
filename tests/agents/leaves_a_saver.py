"""An agent whose child saves its work as it is stopped, after the agent has gone:
what an ACP adapter leaves (claude-agent-acp exits and its Claude Code CLI, sent
SIGTERM, writes the session's transcript as it leaves).

    leaves_a_saver.py SAVED_FILE PIDFILE [--then-wait] [--setsid]

Starts a child in its process group whose stdout is not the agent's (so the
agent's pipes end with the agent, as the adapter's do) and which, on SIGTERM,
takes a moment and then writes "saved" to SAVED_FILE. Writes the child's pid to
PIDFILE, prints "ready" and exits 0 (``--then-wait``: waits for a signal first).
With ``--setsid`` the child starts a session of its own, so no signal to the
agent's group reaches it.
"""

import os
import signal
import subprocess
import sys

saved, pidfile = sys.argv[1], sys.argv[2]

CHILD = """
import signal, sys, time
def save(*_):
    time.sleep(0.3)  # a flush that takes a moment: longer than nothing at all
    with open(sys.argv[1], "w") as file:
        file.write("saved")
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
print("armed", flush=True)
while True:
    signal.pause()
"""

child = subprocess.Popen([sys.executable, "-c", CHILD, saved], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                         start_new_session="--setsid" in sys.argv[3:])
assert child.stdout is not None
if child.stdout.readline() != b"armed\n":
    sys.exit("the child did not arm itself")
with open(pidfile + ".tmp", "w") as file:
    file.write(str(child.pid))
os.replace(pidfile + ".tmp", pidfile)
print("ready", flush=True)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
if "--then-wait" in sys.argv[3:]:
    signal.pause()
sys.exit(0)
