"""Printing one JSON event per line the way the agent CLIs do (compact, raw UTF-8),
for the fake CLIs; with two stand-ins for what Python's ``json.dumps`` cannot put on
a UTF-8 stdout but a real CLI may: :data:`LONE_SURROGATE` becomes the JSON escape of
half an emoji (``\\ud83d``, as an ES2019 ``JSON.stringify`` writes one), and
:data:`BAD_BYTE` a byte that is not UTF-8 (0xFF)."""

from __future__ import annotations

import json
import sys
from typing import Any

LONE_SURROGATE = "<lone-surrogate>"
BAD_BYTE = "<bad-byte>"


def emit(event: dict[str, Any]) -> None:
    """Print ``event`` as one compact line, the stand-ins turned into their bytes."""
    line = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    if LONE_SURROGATE in line or BAD_BYTE in line:
        raw = line.encode("utf-8").replace(LONE_SURROGATE.encode(), b"\\ud83d")
        sys.stdout.flush()
        sys.stdout.buffer.write(raw.replace(BAD_BYTE.encode(), b"\xff") + b"\n")
        sys.stdout.buffer.flush()
        return
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
