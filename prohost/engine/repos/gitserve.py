"""The far end of :class:`prohost.engine.repos.gitsession.ConfinedGit`: run inside a
run's confinement (bubblewrap), it runs the harness's git commands one after
another, so that reading what a run left (``changes``, gc) costs one confined
process, not one per git (docs/protocol.md §13).

Run as a script by path (``python -I -S gitserve.py``) and importing only ``os``
and ``sys`` (frozen into the interpreter), so it starts in the time Python itself
takes. Each request, on stdin: a line ``<arguments> <variables>`` (counts), then
each argument and each ``NAME=value`` of the environment, each ended by a NUL
byte. Each answer, on stdout: a line ``<status> <stdout length> <stderr length>``
then those bytes. The command's output goes to two files in the confinement's own
``/tmp`` (a tmpfs of its own) while it runs, so a large one never blocks a pipe.
End of stdin: it exits. It has no timeout of its own: the harness kills its
whole confinement (its PID namespace) when a command outlives its bound.
"""

import os
import sys

_OUT, _ERR = "/tmp/.prohost-git-out", "/tmp/.prohost-git-err"
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC


class _Requests:
    """stdin, read in blocks."""

    def __init__(self) -> None:
        self.buffer = b""

    def _more(self) -> bool:
        data = os.read(0, 1 << 16)
        self.buffer += data
        return bool(data)

    def until(self, end: bytes) -> bytes | None:
        while end not in self.buffer:
            if not self._more():
                return None
        found, _, self.buffer = self.buffer.partition(end)
        return found


def _run(argv: list[bytes], env: dict[bytes, bytes]) -> tuple[int, bytes, bytes]:
    try:
        pid = os.posix_spawnp(argv[0], argv, env, file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, _OUT, _WRITE, 0o600),
            (os.POSIX_SPAWN_OPEN, 2, _ERR, _WRITE, 0o600)])
    except OSError as exc:
        return 127, b"", f"fatal: could not run git: {exc}\n".encode()
    _, status = os.waitpid(pid, 0)
    found = []
    for name in (_OUT, _ERR):
        with open(name, "rb") as file:
            found.append(file.read())
        os.unlink(name)
    return os.waitstatus_to_exitcode(status), found[0], found[1]


def serve() -> int:
    """Answer requests until stdin ends; 0 then."""
    requests = _Requests()
    while True:
        head = requests.until(b"\n")
        if head is None:
            return 0
        counts = [int(word) for word in head.split()]
        words = []
        for _ in range(counts[0] + counts[1]):
            word = requests.until(b"\0")
            if word is None:
                return 1
            words.append(word)
        argv = words[:counts[0]]
        env = dict(word.partition(b"=")[::2] for word in words[counts[0]:])
        status, out, err = _run(argv, env)
        os.write(1, b"%d %d %d\n" % (status, len(out), len(err)))
        for data in (out, err):
            view = memoryview(data)
            while view:
                view = view[os.write(1, view):]


if __name__ == "__main__":
    sys.exit(serve())
