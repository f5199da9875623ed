"""A real process holding a home's lock, as a harness, ``agent gc`` or a harness
that could not write its pid (a full disk) holds it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Literal

HOLDER = """
import fcntl, os, signal, sys
def told(*_):
    print("signalled", flush=True)
    os._exit(143)
signal.signal(signal.SIGTERM, told)
signal.signal(signal.SIGINT, told)
from pathlib import Path
from prohost.home import LOCK_FILE, InstanceLock
home, kind = Path(sys.argv[1]), sys.argv[2]
if kind == "unrecorded":  # the flock, and an emptied file: the pid's write failed
    home.mkdir(parents=True, exist_ok=True)
    fd = os.open(home / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.ftruncate(fd, 0)
else:
    lock = InstanceLock.acquire(home, kind=kind)
print("locked", flush=True)
sys.stdin.read()
"""


def start_holder(home: Path, kind: Literal["harness", "gc", "unrecorded"] = "harness"
                 ) -> subprocess.Popen[str]:
    """A child holding ``home``'s lock as ``kind`` until its stdin ends; it prints
    "signalled" and exits 143 if it is sent SIGTERM or SIGINT (see :func:`signalled`)."""
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(home), kind],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    # Blocks until the child holds the lock (or dies, which reads as "").
    assert child.stdout.readline() == "locked\n"
    return child


def stop_holder(child: subprocess.Popen[str]) -> None:
    if child.poll() is None:
        child.kill()
    child.wait(timeout=30)
    for pipe in (child.stdin, child.stdout):
        if pipe is not None:
            pipe.close()


def signalled(child: subprocess.Popen[str]) -> bool:
    """End the holder (end of its stdin) and say whether it was signalled before."""
    assert child.stdin is not None and child.stdout is not None
    child.stdin.close()
    rest = child.stdout.read()
    child.wait(timeout=30)
    return "signalled" in rest or child.returncode != 0
