"""A hostile agent: tries each attack it is told, says what it met, and exits 0.

    attacker.py ACTION:ARG ...

- ``connect:PATH``: connect to the Unix socket PATH and send a line;
- ``abstract:NAME``: the same to the abstract socket NAME (without its NUL);
- ``env-connect:VAR``: the same to the socket the variable VAR names;
- ``kill:PID``: send SIGTERM to PID;
- ``chmod:PATH``: make PATH mode 0777;
- ``utime:PATH``: set PATH's times to 1 January 2001;
- ``tty:PATH``: write a line to the terminal PATH;
- ``orphan:SECONDS``: leave a process that sleeps SECONDS, out of the group and the
  session (``setsid`` and a double fork), holding none of the agent's pipes.

What it says is its own word: the tests judge by what happened outside.
"""

import errno
import os
import socket
import sys


def connect(address: str) -> str:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(5)
    conn.connect(address)
    conn.sendall(b"owned\n")
    conn.close()
    return "connected"


def env_connect(name: str) -> str:
    value = os.environ.get(name)
    if value is None:
        return "unset"
    return connect(value)


def kill(pid: str) -> str:
    os.kill(int(pid), 15)
    return "signalled"


def chmod(path: str) -> str:
    os.chmod(path, 0o777)
    return "changed"


def utime(path: str) -> str:
    os.utime(path, (978307200, 978307200))
    return "changed"


def tty(path: str) -> str:
    with open(path, "w") as terminal:
        terminal.write("owned\n")
    return "written"


def orphan(seconds: str) -> str:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.execvp("sleep", ["sleep", seconds])
        os._exit(0)
    os.wait()
    return "left"


ACTIONS = {"connect": connect, "abstract": lambda name: connect("\0" + name),
           "env-connect": env_connect, "kill": kill, "chmod": chmod, "utime": utime,
           "tty": tty, "orphan": orphan}


def main() -> None:
    for word in sys.argv[1:]:
        action, _, argument = word.partition(":")
        try:
            said = ACTIONS[action](argument)
        except OSError as exc:
            said = errno.errorcode.get(exc.errno or 0, "failed")
        print(f"{action}:{argument}={said}", flush=True)


if __name__ == "__main__":
    main()
