"""Long-running ``prohost`` commands (``server``, ``agent run``) as real subprocesses
whose output lines a test waits for, and the short commands typed beside them.

Synchronous on purpose: the newcomer tests type commands one after another as a
person would. A reader thread per stream collects lines; a test waits on a
condition until the line it needs has arrived (never on a clock).
"""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

#: Longest wait for a line, so a broken build fails instead of hanging.
LINE_WAIT_S = 60.0


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """This environment without the person's PROHOST_ settings; ``home`` as PROHOST_HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROHOST_")}
    env["PROHOST_HOME"] = str(home)
    env.update(extra)
    return env


class Background:
    """A started command: every line of its stdout and stderr, as they arrive."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> None:
        self.argv = list(argv)
        self.proc = subprocess.Popen(
            self.argv, env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._open = 2
        self._readers = [threading.Thread(target=self._read, args=(stream,), daemon=True)
                         for stream in (self.proc.stdout, self.proc.stderr)]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: object) -> None:
        assert hasattr(stream, "readline")
        for raw in iter(stream.readline, b""):
            with self._changed:
                self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._open -= 1
            self._changed.notify_all()

    def wait_line(self, *texts: str, since: int = 0) -> str:
        """The first line holding every one of ``texts``, once there is one; only
        lines from the ``since``-th on (``len(lines)`` at an earlier moment)."""
        def found() -> str | None:
            return next((line for line in self.lines[since:]
                         if all(t in line for t in texts)), None)

        with self._changed:
            self._changed.wait_for(lambda: found() is not None or self._open == 0,
                                   timeout=LINE_WAIT_S)
            line = found()
        if line is None:
            ended = "it exited" if self._open == 0 else f"not within {LINE_WAIT_S:.0f} s"
            raise AssertionError(f"{self.argv} never wrote {texts!r} ({ended}); "
                                 "it wrote:\n" + "\n".join(self.lines))
        return line

    def stop(self) -> None:
        """SIGINT (a Ctrl-C), then a kill if it has not exited within 10 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for reader in self._readers:
            reader.join(timeout=10)


class OnATerminal(Background):
    """A started command whose stdout and stderr are a terminal (a pty), as when a
    person types it: ``agent run`` draws its live panel there. ``lines`` holds the
    screen's bytes as text, cut at newlines (frames included)."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> None:
        self.argv = list(argv)
        main, side = pty.openpty()
        try:
            self.proc = subprocess.Popen(
                self.argv, env={**env, "TERM": "xterm-256color", "COLUMNS": "160",
                                "LINES": "40"},
                cwd=cwd, stdin=subprocess.DEVNULL, stdout=side, stderr=side,
                start_new_session=True,
            )
        finally:
            os.close(side)
        self.lines = []
        self._changed = threading.Condition()
        self._open = 1
        self._readers = [threading.Thread(target=self._read_tty, args=(main,), daemon=True)]
        self._readers[0].start()

    def _read_tty(self, fd: int) -> None:
        rest = b""
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: every writer has gone
                chunk = b""
            if not chunk:
                break
            rest += chunk
            *done, rest = rest.split(b"\n")
            with self._changed:
                self.lines.extend(line.decode("utf-8", "replace") for line in done)
                self._changed.notify_all()
        os.close(fd)
        with self._changed:
            self.lines.append(rest.decode("utf-8", "replace"))
            self._open = 0
            self._changed.notify_all()


@contextmanager
def on_a_terminal(argv: Sequence[str], env: Mapping[str, str],
                  cwd: Path) -> Iterator[Background]:
    """:class:`OnATerminal`, stopped (Ctrl-C) on the way out."""
    started = OnATerminal(argv, env, cwd)
    try:
        yield started
    finally:
        started.stop()


@contextmanager
def background(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> Iterator[Background]:
    """:class:`Background`, stopped on the way out."""
    started = Background(argv, env, cwd)
    try:
        yield started
    finally:
        started.stop()


def banner_field(server: Background, field: str) -> str:
    """A value of ``prohost server``'s banner (``pairing code:``, ``HTTP:``, ``WebSocket:``)."""
    return server.wait_line(field).split(field, 1)[1].strip()


def run(argv: Sequence[str], env: Mapping[str, str], cwd: Path,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """A short command, run to its end, its output captured."""
    return subprocess.run(list(argv), env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout, check=False)


def git_repo(path: Path) -> Path:
    """A checkout with one commit, as a person's project would be."""
    path.mkdir(parents=True)
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git[:3], "init", "-q", "-b", "main"], check=True)
    (path / "README").write_text("a project\n")
    subprocess.run([*git, "add", "README"], check=True)
    subprocess.run([*git, "commit", "-qm", "start"], check=True)
    return path
