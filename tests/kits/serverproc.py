"""``prohost server`` as a real subprocess, and the other commands a person types
against it (``agent pair``, ``send``, ``runs``), for tests of the command line."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio

BANNER_FIELDS = ("pairing code:", "API token:", "WebSocket:", "HTTP:")


def clean_env(home: Path | None = None, **extra: str) -> dict[str, str]:
    """This environment without the person's PROHOST_ settings; ``home`` as PROHOST_HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROHOST_")}
    if home is not None:
        env["PROHOST_HOME"] = str(home)
    env.update(extra)
    return env


@attrs.define
class ServerProcess:
    proc: trio.Process
    banner: list[str]
    fields: dict[str, str]
    stderr: list[str]

    @property
    def http_url(self) -> str:
        return self.fields["HTTP:"]

    @property
    def ws_url(self) -> str:
        return self.fields["WebSocket:"]

    @property
    def code(self) -> str:
        return self.fields["pairing code:"]

    @property
    def token_file(self) -> Path:
        """Where the server wrote its API token (the banner's first word after it)."""
        return Path(self.fields["API token:"].split()[0])

    @property
    def state_flags(self) -> list[str]:
        """``--state DIR`` for ``send`` and ``runs cancel``: where the token is."""
        return ["--state", str(self.token_file.parent)]

    def api_headers(self) -> dict[str, str]:
        """The header the people's API requires, with the token the server wrote."""
        return {"Authorization": f"Bearer {self.token_file.read_text().strip()}"}

    async def wait_stderr(self, text: str) -> str:
        """The first stderr line holding ``text``, once the server has written it."""
        while True:
            for line in self.stderr:
                if text in line:
                    return line
            await self._stderr_changed.wait()

    _stderr_changed: trio.Event = attrs.field(factory=trio.Event)

    def poke(self) -> None:
        self._stderr_changed.set()
        self._stderr_changed = trio.Event()


async def _lines(stream: trio.abc.ReceiveStream, into: list[str], poke: Callable[[], None],
                 closed: trio.Event | None = None) -> None:
    pending = b""
    while chunk := await stream.receive_some():
        *lines, pending = (pending + chunk).split(b"\n")
        into.extend(line.decode("utf-8", "replace") for line in lines)
        poke()
    if closed is not None:
        closed.set()
    poke()


@asynccontextmanager
async def server_process(
    *flags: str, env: Mapping[str, str] | None = None
) -> AsyncIterator[ServerProcess]:
    """``prohost server --host 127.0.0.1 --port 0 FLAGS``, once its banner is read.
    Stopped with SIGINT on the way out (killed if it does not stop within 10 s)."""
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "prohost", "server", "--host", "127.0.0.1", "--port", "0",
         *flags],
        env=dict(env) if env is not None else clean_env(),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    server = ServerProcess(proc, [], {}, [])
    async with trio.open_nursery() as nursery:
        stdout_changed = trio.Event()

        def poke_stdout() -> None:
            nonlocal stdout_changed
            stdout_changed.set()
            stdout_changed = trio.Event()

        stdout_closed = trio.Event()
        nursery.start_soon(_lines, proc.stdout, server.banner, poke_stdout, stdout_closed)
        nursery.start_soon(_lines, proc.stderr, server.stderr, server.poke)
        try:
            while not all(any(f in line for line in server.banner) for f in BANNER_FIELDS):
                if stdout_closed.is_set():
                    await proc.wait()
                    raise AssertionError(f"the server exited with {proc.returncode}: "
                                         f"{server.stderr}")
                await stdout_changed.wait()
            for line in server.banner:
                for field in BANNER_FIELDS:
                    if field in line:
                        server.fields[field] = line.split(field, 1)[1].strip()
            yield server
        finally:
            with trio.CancelScope(shield=True):
                if proc.returncode is None:
                    proc.send_signal(signal.SIGINT)
                    with trio.move_on_after(10):
                        await proc.wait()
                    if proc.returncode is None:
                        proc.kill()
                        await proc.wait()
            nursery.cancel_scope.cancel()


async def prohost(*args: str, env: Mapping[str, str]) -> subprocess.CompletedProcess[bytes]:
    """``python -m prohost ARGS``, run to its end, output captured."""
    return await trio.run_process(
        [sys.executable, "-m", "prohost", *args], env=dict(env), check=False,
        capture_stdout=True, capture_stderr=True, stdin=subprocess.DEVNULL,
    )


async def run_printed(line: str, env: Mapping[str, str],
                      *extra: str) -> subprocess.CompletedProcess[bytes]:
    """A command the program printed for a person, run exactly as printed (split as
    a shell would; ``extra`` words after it), to its end, output captured."""
    return await trio.run_process(
        [*shlex.split(line), *extra], env=dict(env), check=False, capture_stdout=True,
        capture_stderr=True, stdin=subprocess.DEVNULL,
    )


def quoted_commands(text: str) -> list[str]:
    """The commands in backquotes in ``text``, in order."""
    return re.findall(r"`([^`]+)`", text)


def without_prohost_on_path(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with every PATH folder holding a ``prohost`` left out, as for a person
    who installed it in a virtual environment they did not activate."""
    folders = [folder for folder in env.get("PATH", "").split(os.pathsep)
               if folder and not os.access(os.path.join(folder, "prohost"), os.X_OK)]
    return {**env, "PATH": os.pathsep.join(folders)}
