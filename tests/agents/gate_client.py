"""The agent's end of the test's Gate (tests/kits/harness.py), shared by the gated fakes.

An agent script imports it from its own folder (Python puts a script's folder on
``sys.path``).
"""

import os
import socket
import sys
from typing import NoReturn


def announce(port: int) -> socket.socket:
    """Tell the Gate this run started: ``start <run id> <pid>``."""
    conn = socket.create_connection(("127.0.0.1", port))
    run_id = os.environ.get("PROHOST_RUN_ID", "?")
    conn.sendall(f"start {run_id} {os.getpid()}\n".encode())
    return conn


def obey(conn: socket.socket) -> NoReturn:
    """Wait for the Gate's word: ``reply TEXT`` prints TEXT and exits 0, ``exit N``
    says so on stderr and exits N; a Gate that goes away means exit 3."""
    line = conn.makefile("r", encoding="utf-8").readline().rstrip("\n")
    if line.startswith("reply "):
        print(line[len("reply ") :])
        sys.exit(0)
    if line.startswith("exit "):
        print("the gate told me to fail", file=sys.stderr)
        sys.exit(int(line[len("exit ") :]))
    sys.exit(3)
