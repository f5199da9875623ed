"""Delivery signatures (docs/protocol.md §3): HMAC-SHA256 over ``"{timestamp}.{body}"``."""

from __future__ import annotations

import hashlib
import hmac

#: How far a delivery's timestamp may be from this machine's clock.
MAX_SKEW_S = 300
#: Seconds; a timestamp further from zero than this is not compared as a float.
_FAR_S = 2**53


def sign(secret: str, timestamp: int, body: str) -> str:
    """The ``signature`` value a server puts on a delivery."""
    # "surrogatepass": a body holding a lone surrogate cannot be valid UTF-8, and is
    # refused (400) once its signature is known good; checking that signature must
    # not fail on it. For every valid text this is plain UTF-8.
    message = f"{timestamp}.{body}".encode("utf-8", "surrogatepass")
    digest = hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()
    return f"v1={digest}"


def check(secret: str, timestamp: object, body: str, signature: object, now: float) -> str | None:
    """Why the signature is not acceptable, or ``None`` when it is.

    The comparison is constant-time; the hex digest compares case-insensitively.
    """
    if isinstance(timestamp, bool) or not isinstance(timestamp, int):
        return "timestamp missing or not an integer"
    # A float minus a 400-digit int overflows: such a timestamp is simply far off.
    if abs(timestamp) > _FAR_S:
        return f"timestamp is ages from this machine's clock (limit ±{MAX_SKEW_S} s)"
    if abs(now - timestamp) > MAX_SKEW_S:
        skew = int(now - timestamp)
        return f"timestamp is {skew} s from this machine's clock (limit ±{MAX_SKEW_S} s)"
    if not isinstance(signature, str) or not signature:
        return "signature missing"
    if not signature.isascii():  # a hex digest is; and only ASCII can be compared
        return "signature does not match"
    expected = sign(secret, timestamp, body)
    if not hmac.compare_digest(expected.encode(), signature.strip().lower().encode()):
        return "signature does not match"
    return None
