"""A run's private CODEX_HOME: how a Codex run gets its MCP server's token.

A token goes nowhere a child of the agent could read it: not argv (``ps``), not
the environment (every command the agent runs inherits it). Codex reads a static
``Authorization`` header from its config (``http_headers`` of an
``[mcp_servers.<name>]`` table: ``McpServerTransportConfig::StreamableHttp`` in
openai/codex ``codex-rs/core/src/config/types.rs``, sent by
``build_default_headers`` in ``codex-rs/rmcp-client/src/utils.rs``), and its
config lives in CODEX_HOME. So the run's folder gets an overlay of the account's
CODEX_HOME: a symlink to each of its entries, so the login, sessions and logs are
the real ones (a resumed thread is found, a new one is kept), and a
``config.toml`` (0600) = the real one plus the run's server. Blocking file I/O,
called from :meth:`CodexBrain.wire_mcp <prohost.engine.agent.brains.codex.CodexBrain.wire_mcp>`
in a worker thread.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path

from prohost.engine.accounts.logins import SETTINGS_MAX_BYTES, Refused, read_guarded
from prohost.engine.agent.brains.base import MCP_SERVER_NAME, McpError, write_private
from prohost.engine.agent.usage import from_codex_rollout_line
from prohost.wire.usage import Usage

#: Codex's configuration folder (login, config.toml, sessions, logs).
CODEX_HOME_ENV = "CODEX_HOME"
#: Folders of CODEX_HOME Codex writes a run's state into: made in the real home
#: before an overlay links to them, so nothing a run keeps is lost with it.
_CODEX_SHARED_DIRS = ("sessions", "log")


def codex_home(env: Mapping[str, str]) -> Path:
    """The CODEX_HOME Codex would use with ``env``: the variable, else ``~/.codex``."""
    named = env.get(CODEX_HOME_ENV, "").strip()
    if named:
        return Path(named)
    home = env.get("HOME", "").strip()
    return (Path(home) if home else Path.home()) / ".codex"


def read_config(config: Path, hidden: Sequence[Path]) -> str:
    """The text of Codex's ``config.toml`` (empty when there is none), read as a file
    a run may have written (the account's folder is one of its places): never
    through a link at its end (O_NOFOLLOW), and never from a folder whose real path
    lies in one of ``hidden`` (the secret stores): a run that made it a link to
    ``~/.cargo/credentials.toml`` would otherwise have the token copied into the
    next run's CODEX_HOME (issue 36, attack 7): the one guarded reader,
    :func:`~prohost.engine.accounts.logins.read_guarded`. Raises :class:`McpError`
    then, ``OSError`` when it cannot be read."""
    try:
        data = read_guarded(config, hidden=hidden, max_bytes=SETTINGS_MAX_BYTES)
    except Refused as exc:
        raise McpError(f"{exc}; point CODEX_HOME elsewhere or replace it by a plain "
                       "file") from None
    return "" if data is None else data.decode("utf-8")


def codex_overlay(base: Path, folder: Path, url: str, token: str,
                  hidden: Sequence[Path] = ()) -> Path:
    """``folder/codex-home``: ``base`` seen through symlinks, but for a private
    ``config.toml`` that adds the run's MCP server with its bearer header (read as
    :func:`read_config` does, never through a link nor from a place in
    ``hidden``). Raises :class:`McpError` when ``base`` cannot be read or already
    names the server."""
    try:
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Made in the real home first: through the symlinks, Codex keeps the
        # run's thread (resumed by the lane's next turn) and its logs there.
        for shared in _CODEX_SHARED_DIRS:
            (base / shared).mkdir(mode=0o700, exist_ok=True)
        config = base / "config.toml"
        text = read_config(config, hidden)
    except (OSError, UnicodeDecodeError) as exc:
        raise McpError(f"could not read Codex's folder {base}: "
                       f"{getattr(exc, 'strerror', None) or exc}") from None
    try:
        existing = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise McpError(f"{config} is not valid TOML ({exc}); Codex could not read it "
                       "either: fix it") from None
    servers = existing.get("mcp_servers")
    if isinstance(servers, dict) and MCP_SERVER_NAME in servers:
        raise McpError(f"{config} already defines [mcp_servers.{MCP_SERVER_NAME}]; "
                       "rename that server, the run's own uses the name")
    table = (f"[mcp_servers.{MCP_SERVER_NAME}]\n"
             f"url = {toml_string(url)}\n"
             f"http_headers = {{ Authorization = {toml_string('Bearer ' + token)} }}\n")
    # A new table after the user's text: whatever table it ended in is closed.
    combined = (text.rstrip("\n") + "\n\n" if text.strip() else "") + table
    overlay = folder / "codex-home"
    overlay.mkdir(mode=0o700)
    overlay.chmod(0o700)
    for entry in sorted(base.iterdir()):
        if entry.name != "config.toml":
            (overlay / entry.name).symlink_to(entry)
    write_private(overlay / "config.toml", combined)
    return overlay


#: A thread id as Codex names it (a UUID); anything else is never looked for.
_THREAD_ID = re.compile(r"[0-9A-Za-z][0-9A-Za-z-]{0,99}")
#: Of a rollout file, only this much of its end is read: a thread's file grows
#: with every turn (a command's output is kept in it), and the last token count is
#: written after the turn's last model response, near the end.
ROLLOUT_TAIL_BYTES = 256 * 1024


def find_rollout(home: Path, thread_id: str) -> Path | None:
    """The thread's session rollout file in ``home``, newest first, or ``None``.

    Where Codex keeps it (openai/codex ``codex-rs/core/src/rollout/recorder.rs``,
    ``precompute_log_file_info``, read at commit 035416b):
    ``sessions/YYYY/MM/DD/rollout-YYYY-MM-DDThh-mm-ss-<thread id>.jsonl``, the
    folder and time those of the thread's start (local time); a resumed thread
    appends to the same file. Blocking (a directory listing): call it in a worker
    thread."""
    if not _THREAD_ID.fullmatch(thread_id):
        return None
    found = sorted((home / "sessions").glob(f"*/*/*/rollout-*-{thread_id}.jsonl"),
                   reverse=True)
    return found[0] if found else None


def rollout_totals(home: Path, thread_id: str) -> Usage | None:
    """The thread's running totals as its rollout file last recorded them (the last
    ``token_count`` event in its last :data:`ROLLOUT_TAIL_BYTES`), or ``None`` when
    there is no such file or event. Raises :class:`OSError` when the file cannot be
    read. Blocking: call it in a worker thread."""
    path = find_rollout(home, thread_id)
    if path is None:
        return None
    with path.open("rb") as rollout:
        size = os.fstat(rollout.fileno()).st_size
        start = max(0, size - ROLLOUT_TAIL_BYTES)
        rollout.seek(start)
        tail = rollout.read(ROLLOUT_TAIL_BYTES)
    lines = tail.split(b"\n")
    if start > 0:
        lines = lines[1:]  # the first one is cut
    for line in reversed(lines):
        if b"token_count" in line:
            totals = from_codex_rollout_line(line)
            if totals is not None:
                return totals
    return None


def toml_string(value: str) -> str:
    """``value`` as a TOML basic string (what ``-c key=value`` parses)."""
    out = ['"']
    for char in value:
        if char == '"':
            out.append('\\"')
        elif char == "\\":
            out.append("\\\\")
        elif char == "\n":
            out.append("\\n")
        elif char == "\t":
            out.append("\\t")
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04X}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)
