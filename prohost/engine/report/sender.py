"""What the reporter sends its POSTs through, for the harness's lifetime.

Every POST the reporter makes goes to one server, with its own headers and timeouts,
no redirect followed, no cookie kept and no auth flow. ``httpx.AsyncClient.send``
runs all of that machinery per request anyway (merging the client's defaults, the
auth and redirect loops, the cookie jar, a stream wrapper), and it was about a fifth
of the CPU a completion POST costs. httpx's transport API
(``AsyncHTTPTransport.handle_async_request``) is the same connection pool (httpcore)
without those layers, so the harness posts through a bare transport.

The one thing ``httpx.AsyncClient()`` did for the harness that a bare transport does
not is honour ``HTTP_PROXY`` / ``HTTPS_PROXY`` / ``ALL_PROXY`` (with ``NO_PROXY``).
Where the environment names such a proxy, the harness keeps the client, so a proxied
setup is sent exactly as before.
"""

from __future__ import annotations

import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TypeAlias

import httpx

__all__ = ["CLIENT_HEADERS", "Sender", "open_sender", "proxied"]

#: A transport (the harness without a proxy) or a client (with one, or a test's own).
Sender: TypeAlias = httpx.AsyncClient | httpx.AsyncBaseTransport

#: The headers ``httpx.AsyncClient()`` adds to every request, sent over the transport
#: too, so the server sees the same request either way (a test compares the two).
CLIENT_HEADERS: tuple[tuple[str, str], ...] = (
    ("Accept", "*/*"),
    ("Accept-Encoding", "gzip, deflate"),
    ("Connection", "keep-alive"),
    ("User-Agent", f"python-httpx/{httpx.__version__}"),
)


def proxied() -> bool:
    """Whether ``httpx.AsyncClient()`` would send through a proxy: an http, https or
    all proxy in the environment, read as httpx reads it (urllib's ``getproxies``)."""
    found = urllib.request.getproxies()
    return any(found.get(scheme) for scheme in ("http", "https", "all"))


@asynccontextmanager
async def open_sender() -> AsyncIterator[Sender]:
    """The harness's sender until the block ends, which closes its connections.

    A bare ``httpx.AsyncHTTPTransport`` (TLS verified, as the client's default
    transport is: same settings), or an ``httpx.AsyncClient`` where :func:`proxied`.
    Cancelled: the pool is closed as httpx closes it (as the client did before).
    """
    if proxied():
        async with httpx.AsyncClient() as client:
            yield client
    else:
        async with httpx.AsyncHTTPTransport() as transport:
            yield transport
