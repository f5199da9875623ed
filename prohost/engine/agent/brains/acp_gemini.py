"""Gemini CLI's saved session, kept loadable from one turn to the next.

Gemini CLI keeps each session it starts in
``<GEMINI_CLI_HOME or ~>/.gemini/tmp/<project>/chats/session-<UTC minute>-<id[:8]>.jsonl``
(an append-only log whose ``{"$set": {"messages": […]}}`` records replace the
messages read so far). Two of its bugs lose that conversation once a new process
takes it back with ``session/load``, as the harness's next turn does (read in
@google/gemini-cli 0.61's bundle; google-gemini/gemini-cli#28693, #28775):

* ``loadSession`` builds the session's config first, and the config's start opens
  a *new* recording for the same id (``ChatRecordingService.initialize`` without
  resumed data), named by the current minute: a load in the minute the session was
  started appends a fresh header and a ``$set`` of the bare context to the
  session's own file. The file then holds nothing resumable, is left out of the
  listing, and the load fails "No previous sessions found for this project".
* A load in a later minute works, but leaves that fresh, non-resumable file
  behind under the same short id; the next process's start-up session cleanup (on
  by default, ``general.sessionRetention``) deletes every non-resumable file *and
  every file whose name ends in its short id* (``-<id[:8]>.jsonl``): the session's
  own file with it, so the turn after fails the same way.

Both only ever touch files named ``session-<minute>-<id[:8]>.jsonl``. Before a turn
loads a Gemini session, its file is renamed ``session-<id>.jsonl`` (once; later
turns find it so): Gemini lists every ``session-*.jsonl`` file and reads the id
from inside, loads it, and records the later turns into the file it loaded; its
recorder never makes that name, and the cleanup's short-id match cannot match it.
What is left to Gemini's own cleanup are its stray files, and with them (as it
deletes them) the session's saved tool outputs and logs.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger("prohost.brains.acp")

#: The name Gemini CLI's recorder gives a session's file (minute, short id).
_BY_MINUTE = re.compile(r"session-\d{4}-\d\d-\d\dT\d\d-\d\d-([0-9A-Za-z]{8})\.jsonl")
#: A session id that can name a file (Gemini's are UUIDs).
_SESSION_ID = re.compile(r"[0-9A-Za-z][0-9A-Za-z-]{7,127}")
#: How much of a file's start is read for its header (Gemini's is one short line).
_HEAD_BYTES = 4096


def gemini_folder(env: Mapping[str, str]) -> Path | None:
    """Where Gemini CLI run with ``env`` keeps its state (``GEMINI_CLI_HOME``, else
    ``HOME``, then ``.gemini``); ``None`` without either."""
    home = (env.get("GEMINI_CLI_HOME") or env.get("HOME") or "").strip()
    return Path(home) / ".gemini" if home else None


def keep_loadable(gemini: Path, session_id: str) -> Path | None:
    """Rename session ``session_id``'s file under ``gemini`` (Gemini CLI's folder as
    the harness reaches it) to ``session-<id>.jsonl``, where Gemini's bugs cannot
    reach it (see the module's notes); the file kept, or ``None`` when there is
    none to keep. Of several files by minute (a session loaded before this was
    done), the earliest is the session's own: later ones are its loads' strays.
    Links are never followed. Never raises: the worst is a turn that starts a new
    session, as it did before. Blocking."""
    if not _SESSION_ID.fullmatch(session_id):
        return None
    try:
        for chats in sorted((gemini / "tmp").glob("*/chats")):
            if chats.is_symlink() or chats.parent.is_symlink() or not chats.is_dir():
                continue  # not Gemini's own: the harness follows no link a run made
            kept = chats / f"session-{session_id}.jsonl"
            if os.path.lexists(kept):
                return kept
            found = sorted(entry for entry in chats.iterdir()
                           if (match := _BY_MINUTE.fullmatch(entry.name))
                           and match.group(1) == session_id[:8]
                           and _session_of(entry) == session_id)
            if found:
                os.rename(found[0], kept)
                log.info("kept Gemini CLI's session %s loadable: %s is now %s",
                         session_id, found[0].name, kept.name)
                return kept
    except OSError as exc:
        log.warning("could not keep Gemini CLI's session %s loadable (%s); its next "
                    "turn may start a new session", session_id, exc)
    return None


def _session_of(path: Path) -> str | None:
    """The session id in the header (first line) of a Gemini CLI session file; not
    a link, not a large read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        head = os.read(fd, _HEAD_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        header = json.loads(head.split(b"\n", 1)[0])
    except ValueError:
        return None
    session = header.get("sessionId") if isinstance(header, dict) else None
    return session if isinstance(session, str) else None
