"""An agent that leaves a mark for every execution: appends ``RUN_ID PID`` to the
file named by its first argument, reads the prompt, and prints ``done``. A prompt
containing ``hold`` (or ``--hold``, whatever the prompt, even none) makes it wait
until it is killed (so a test can see who kills it).

marker.py FILE [--hold]
"""

import os
import signal
import sys

with open(sys.argv[1], "a") as marks:
    marks.write(f"{os.environ.get('PROHOST_RUN_ID', '?')} {os.getpid()}\n")
prompt = sys.stdin.read()
if "--hold" in sys.argv[2:]:
    # Silent, as an agent thinking before its first output: a write to a pipe
    # whose harness died would end it (EPIPE), and hide whether anyone killed it.
    while True:
        signal.pause()
if "hold" in prompt:
    print("holding", file=sys.stderr, flush=True)
    while True:
        signal.pause()
sys.stdout.write("done")
