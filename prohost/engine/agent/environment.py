"""What a run's agent is given besides its prompt: its environment and its private folder.

Both are pure and the same for every brain: the environment is the harness's own
minus anything that holds a secret, plus markers naming the run; the private
folder (for the brain's MCP configuration) is named by a digest of the run id,
never by the id itself (§3). :mod:`prohost.engine.run.execute` uses both for every
attempt; :mod:`prohost.engine.run.runner` names the folder.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path

from prohost.engine.repos.gitcmd import GIT_LOCATION_VARS

#: Set to ``1`` for every agent the harness starts, so instructions the agent reads
#: from disk can tell a paired run (someone is waiting in a thread) from any other.
PAIRED_RUN_ENV = "PROHOST_PAIRED_RUN"
RUN_ID_ENV = "PROHOST_RUN_ID"

#: Hex digits of a run id's SHA-256 that name its scratch folder: 128 bits, so
#: two run ids never meet by chance, and the name is short and plain.
SCRATCH_NAME_CHARS = 32

#: Claude Code sets this in its own shells. A harness started from one would
#: pass it on, and the agent would then believe it was nested inside Claude Code.
_NESTED_CLAUDE_ENV = "CLAUDECODE"
#: Never passed on: Claude Code's nesting marker, and the variables that point git at
#: one repository (a harness started from a git hook or an editor's terminal has
#: them). The agent works in its own checkouts: with GIT_DIR or GIT_INDEX_FILE
#: inherited, every git command it runs would read and write that other
#: repository instead, whatever its working directory.
_DROPPED = frozenset({_NESTED_CLAUDE_ENV, *GIT_LOCATION_VARS})


def scratch_folder(root: Path, run_id: str) -> Path:
    """The run's private folder under ``root``: named by a digest of the run id.

    Never the id as it stands: the id comes from the wire, and ``..`` or ``.``
    would name ``$PROHOST_HOME`` or ``root`` itself, which the run's cleanup then
    removes (§3: no body field is ever used as a file or folder name). A hex
    digest cannot hold a separator, a dot, NUL, or run over 255 bytes.
    """
    return root / run_digest(run_id)


def run_digest(run_id: str) -> str:
    """The name a run's own file or folder is given (its scratch folder, its kept
    stderr): :data:`SCRATCH_NAME_CHARS` hex digits of a digest of the run id. A name
    made once stays the same, so files an earlier harness left are found again."""
    # surrogatepass: a run id is JSON text, which can carry a lone surrogate.
    return hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()[
        :SCRATCH_NAME_CHARS]


def make_private_folder(path: Path) -> None:
    """Create ``path`` (and its parents) readable by this user only, even if it existed.

    Blocking: call it through ``trio.to_thread``.
    """
    # Each missing folder made 0700 too, not only the last: mkdir's parents get
    # 0777 less the umask, which left a run's scratch folder readable by others
    # ($PROHOST_HOME/runs/<digest>, issue 37); chmod, since the umask narrows mode.
    missing = []
    folder = path
    while not folder.is_dir():
        missing.append(folder)
        folder = folder.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=0o700)
        folder.chmod(0o700)
    path.chmod(0o700)


def agent_env(base: Mapping[str, str], run_id: str, secrets: Sequence[str]) -> dict[str, str]:
    """The environment an agent runs with: ``base`` plus the run's markers, minus secrets
    and git's repository-locating variables.

    A variable is dropped when its value contains a secret anywhere, not only when
    it equals one: ``Authorization: Bearer <token>`` in some variable leaks as much.
    """
    needles = [secret for secret in secrets if secret]
    env = {
        name: value
        for name, value in base.items()
        if name not in _DROPPED and not any(needle in value for needle in needles)
    }
    env[PAIRED_RUN_ENV] = "1"
    env[RUN_ID_ENV] = run_id
    return env


#: Variables that name one of the person's sockets, or the folder holding them
#: (docs/protocol.md §13): through them a run would reach a program outside its
#: confinement that acts with the person's rights. ssh-agent signs with the
#: person's keys; gpg-agent signs and decrypts; tmux and screen run any command in
#: a new window; the D-Bus session bus starts programs and reads the keyring;
#: XDG_RUNTIME_DIR holds all of these (and the Wayland, PipeWire and Docker
#: sockets); an X display (DISPLAY) takes keystrokes into every window of the
#: session, so it is dropped too, although a run that needs a display (a browser
#: test) then needs a headless one (``xvfb-run``) or ``--allow-write
#: /tmp/.X11-unix``. Each is passed when ``--allow-write`` names the socket (or a
#: folder holding it): see :func:`socket_path`.
SOCKET_VARIABLES = ("SSH_AUTH_SOCK", "GPG_AGENT_INFO", "TMUX", "TMUX_PANE", "STY",
                    "DBUS_SESSION_BUS_ADDRESS", "XDG_RUNTIME_DIR", "WAYLAND_DISPLAY",
                    "DISPLAY", "DOCKER_HOST", "PULSE_SERVER", "SWAYSOCK", "I3SOCK",
                    "KITTY_LISTEN_ON", "NVIM", "NVIM_LISTEN_ADDRESS",
                    "GNOME_KEYRING_CONTROL", "SESSION_MANAGER", "VSCODE_IPC_HOOK_CLI")


def socket_path(name: str, env: Mapping[str, str]) -> Path | None:
    """The socket (or folder of sockets) ``env``'s variable ``name`` names, as a
    path: what ``--allow-write`` must name for it to be passed. ``None`` when it
    names none that a grant could open (``STY``: a screen session, by name only;
    ``DOCKER_HOST`` over TCP, which is not dropped at all)."""
    value = env.get(name, "")
    if name == "TMUX_PANE":
        return socket_path("TMUX", env)
    if name == "TMUX":
        value = value.split(",", 1)[0]
    elif name == "GPG_AGENT_INFO":
        value = value.split(":", 1)[0]
    elif name in ("DBUS_SESSION_BUS_ADDRESS", "PULSE_SERVER"):
        found = [part.removeprefix("path=") for part in value.split(",")
                 if part.startswith("path=") or part.startswith("unix:path=")]
        value = found[0].removeprefix("unix:path=") if found else ""
        value = value.removeprefix("unix:")
    elif name == "DOCKER_HOST":
        value = value.removeprefix("unix://")
    elif name == "DISPLAY":
        display = value.rpartition(":")[2].split(".", 1)[0]
        host = value.rpartition(":")[0]
        value = f"/tmp/.X11-unix/X{display}" if display.isdigit() and host in ("", "unix") else ""
    elif name == "WAYLAND_DISPLAY" and value and not value.startswith("/"):
        runtime = env.get("XDG_RUNTIME_DIR", "")
        value = f"{runtime}/{value}" if runtime else ""
    elif name == "KITTY_LISTEN_ON":
        value = value.removeprefix("unix:")
    elif name == "SESSION_MANAGER":
        value = value.split(",", 1)[0].partition(":")[2] if "unix/" in value else ""
    return Path(value) if value.startswith("/") else None


def without_sockets(env: Mapping[str, str], allowed: Sequence[Path]) -> dict[str, str]:
    """``env`` without :data:`SOCKET_VARIABLES`, except one whose socket
    ``--allow-write`` names (``allowed``: the socket, or a folder holding it), and
    ``DOCKER_HOST`` when it names no Unix socket (``tcp://``, ``ssh://``)."""
    result: dict[str, str] = {}
    for name, value in env.items():
        if name in SOCKET_VARIABLES:
            if name == "DOCKER_HOST" and not value.startswith("unix:"):
                result[name] = value
                continue
            path = socket_path(name, env)
            if path is None or not any(path == grant or grant in path.parents
                                       for grant in allowed):
                continue
        result[name] = value
    return result

