"""A fake agent the test controls over a loopback socket.

It connects to 127.0.0.1:<port> (argv[1]), says ``start <run id> <pid>``, and waits
for one line from the test: ``reply TEXT`` prints TEXT and exits 0, ``exit N``
writes a line to stderr and exits N. If the test goes away, it exits 3.
"""

import sys

from gate_client import announce, obey

sys.stdin.read()
obey(announce(int(sys.argv[1])))
