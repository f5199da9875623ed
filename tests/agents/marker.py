"""An agent that leaves a mark for every execution: appends ``RUN_ID PID`` to the
file named by its first argument, reads the prompt, and prints ``done``. A prompt
containing ``hold`` makes it wait until it is killed (so a test can see who kills it).

marker.py FILE
"""

import os
import signal
import sys

with open(sys.argv[1], "a") as marks:
    marks.write(f"{os.environ.get('PROHOST_RUN_ID', '?')} {os.getpid()}\n")
prompt = sys.stdin.read()
if "hold" in prompt:
    print("holding", file=sys.stderr, flush=True)
    while True:
        signal.pause()
sys.stdout.write("done")
