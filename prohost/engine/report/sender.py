"""What the reporter sends its POSTs through, for the harness's lifetime: one path.

Every POST the reporter makes goes to one server, with its own headers and timeouts,
no redirect followed, no cookie kept and no auth flow. ``httpx.AsyncClient.send``
runs all of that machinery per request anyway (merging the client's defaults, the
auth and redirect loops, the cookie jar, a stream wrapper), and it was about a fifth
of the CPU a completion POST costs. httpx's transport API
(``AsyncHTTPTransport.handle_async_request``) is the same connection pool (httpcore)
without those layers, so the harness posts through a bare transport, always.

The one thing ``httpx.AsyncClient()`` would do for the harness that a bare transport
does not by itself is honour ``HTTP_PROXY`` / ``HTTPS_PROXY`` / ``ALL_PROXY`` (with
``NO_PROXY``). Since every POST goes to one server, the proxy is chosen once, for the
server's URL (:func:`proxy_for`), and given to the transport.
"""

from __future__ import annotations

import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TypeAlias

import httpx

__all__ = ["CLIENT_HEADERS", "Sender", "open_sender", "proxy_for"]

#: What the reporter posts through: the harness's transport (or a test's own).
Sender: TypeAlias = httpx.AsyncBaseTransport

#: The headers ``httpx.AsyncClient()`` adds to every request, sent over the transport
#: too, so the server sees the same request a client would send (a test compares).
CLIENT_HEADERS: tuple[tuple[str, str], ...] = (
    ("Accept", "*/*"),
    ("Accept-Encoding", "gzip, deflate"),
    ("Connection", "keep-alive"),
    ("User-Agent", f"python-httpx/{httpx.__version__}"),
)


def proxy_for(url: str) -> str | None:
    """The proxy ``httpx.AsyncClient()`` would send a request for ``url`` through:
    the environment's proxy for its scheme, else its ``all`` proxy, unless
    ``NO_PROXY`` names its host (read as httpx reads them: urllib's ``getproxies``).
    None: straight to the server."""
    target = httpx.URL(url)
    found = urllib.request.getproxies()
    proxy = found.get(target.scheme) or found.get("all")
    if not proxy:
        return None
    host = f"{target.host}:{target.port}" if target.port else target.host
    if urllib.request.proxy_bypass(host):  # NO_PROXY, as httpx reads it
        return None
    # httpx takes a proxy written without a scheme as an http:// one.
    return proxy if "://" in proxy else f"http://{proxy}"


@asynccontextmanager
async def open_sender(server_url: str) -> AsyncIterator[Sender]:
    """The harness's sender for the server at ``server_url`` until the block ends,
    which closes its connections: an ``httpx.AsyncHTTPTransport`` (TLS verified, as
    a client's default transport is), through :func:`proxy_for` ``server_url``.
    Cancelled: the pool is closed as httpx closes it."""
    async with httpx.AsyncHTTPTransport(proxy=proxy_for(server_url)) as transport:
        yield transport
