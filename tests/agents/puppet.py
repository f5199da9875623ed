"""An agent that prints only when the test tells it to, over a loopback socket.

    puppet.py PORT

It reads the prompt, connects to 127.0.0.1:PORT and obeys one line at a time:
``out TEXT`` prints TEXT on stdout, ``err TEXT`` on stderr (each flushed at once),
``exit N`` exits N. If the test goes away it exits 3. So a test on a still trio
clock decides exactly when the agent was last heard, with no sleeping anywhere.
"""

import socket
import sys

sys.stdin.read()
conn = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
for line in conn.makefile("r", encoding="utf-8"):
    word, _, text = line.rstrip("\n").partition(" ")
    if word == "out":
        print(text, flush=True)
    elif word == "err":
        print(text, file=sys.stderr, flush=True)
    elif word == "exit":
        sys.exit(int(text))
sys.exit(3)
