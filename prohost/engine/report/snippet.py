"""The short line a person reads when the server refuses a report: the start of its
error body, bounded in what is read *and* in what it inflates to.

httpx's own decoding (``aiter_bytes``) inflates a whole compressed chunk at once, so
a small gzip error page can become megabytes before anything is cut. Here the body is
read raw and inflated by zlib only as far as the snippet needs (``max_length``); an
encoding zlib does not speak (``br``, ``zstd``, …) is named, not decoded.
"""

from __future__ import annotations

import zlib

import httpx

#: At most this much of an error body is kept for the line (after inflating) ...
SNIPPET_BYTES = 2048
#: ... and at most this much raw body is read for it.
READ_BYTES = 64 * 1024
#: The longest line a snippet becomes.
SNIPPET_CHARS = 200

#: zlib's window bits per content coding: gzip, and deflate's zlib wrapper (RFC 9110).
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


async def read_snippet(response: httpx.Response) -> str:
    """At most :data:`SNIPPET_BYTES` of the (inflated) body, as one short printable
    line; the status already says what went wrong, so a body that cannot be read
    or decoded only makes the line shorter. Cancelled: stops reading at once."""
    coding = response.headers.get("content-encoding", "").strip().lower()
    if coding in ("", "identity"):
        inflate = None
    elif coding in _WBITS:
        inflate = zlib.decompressobj(_WBITS[coding])
    else:
        return f"(a {coding[:20]}-encoded body)"
    data = bytearray()
    read = 0
    try:
        async for chunk in response.aiter_raw():
            read += len(chunk)
            room = SNIPPET_BYTES - len(data)
            # max_length: what is inflated is bounded by the room left, whatever
            # the chunk would inflate to; the rest of the chunk is not inflated.
            data += chunk[:room] if inflate is None else inflate.decompress(chunk, room)
            if len(data) >= SNIPPET_BYTES or read >= READ_BYTES:
                break
    except (httpx.HTTPError, zlib.error):
        pass  # a courtesy: what was read so far is the line
    text = " ".join(bytes(data[:SNIPPET_BYTES]).decode("utf-8", "replace").split())
    if len(text) > SNIPPET_CHARS:
        text = text[: SNIPPET_CHARS - 1] + "…"
    return text
