"""How an agent's final text becomes the reply (§5.4, §5.5): trimmed, ``None`` for
``NO_REPLY``, and at most :data:`MAX_REPLY_BYTES` with a marker when it was cut.

Each brain's :meth:`~prohost.engine.agent.brains.base.Turn.finish` says its reply
through :func:`final_reply`, once: the runner passes it on as it is.
"""

from __future__ import annotations

#: The whole reply, after trimming, that means "send nothing" (``"reply": null``).
NO_REPLY = "NO_REPLY"

#: A reply is cut to this many UTF-8 bytes (marker included) (§5.4).
MAX_REPLY_BYTES = 1024 * 1024

#: Appended to a reply that was cut, so the reader knows there was more.
REPLY_CUT_MARKER = "[prohost: the reply was over 1 MiB and was cut here]"


def reply_from_text(text: str) -> str | None:
    """The reply an agent's output stands for: trimmed, and ``None`` for ``NO_REPLY``."""
    reply = text.strip()
    return None if reply == NO_REPLY else reply


def cap_reply(reply: str, *, cut: bool = False, limit_bytes: int = MAX_REPLY_BYTES) -> str:
    """``reply``, cut to ``limit_bytes`` with a marker line when it is over the limit.

    ``cut=True`` says the text was already cut upstream (the agent printed more
    than was kept), so it gets the marker even if what is left fits.
    """
    encoded = reply.encode("utf-8")
    if len(encoded) <= limit_bytes and not cut:
        return reply
    tail = "\n\n" + REPLY_CUT_MARKER
    room = max(0, limit_bytes - len(tail.encode("utf-8")))
    # errors="ignore" drops a character the byte cut split in half.
    kept = encoded[:room].decode("utf-8", errors="ignore").rstrip()
    return kept + tail


def final_reply(text: str, *, cut: bool = False) -> str | None:
    """The reply ``text`` (an agent's final message, or its whole stdout) stands for:
    :func:`reply_from_text`, then :func:`cap_reply`. ``cut`` says the text was cut
    upstream: it is then a reply with the marker, never ``NO_REPLY``."""
    if cut:
        return cap_reply(text.strip(), cut=True)
    reply = reply_from_text(text)
    return None if reply is None else cap_reply(reply)
