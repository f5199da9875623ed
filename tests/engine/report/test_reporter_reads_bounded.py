"""What the reporter reads of the server's answer: never more than a bound, whatever
the server sends (docs/protocol.md §7), and what it sends, identical on every attempt.

Against a real HTTP server (hypercorn on 127.0.0.1 port 0) serving a small ASGI app.
"""

from __future__ import annotations

import gzip
import json
from typing import Any

import httpx
import pytest
import trio

from prohost.engine.report.reporter import Reporter, Settlement
from tests.kits.asgi import lifespan, read_body, serving
from tests.kits.reporter import BOUNDED_PATH as PATH
from tests.kits.reporter import BOUNDED_PAYLOAD as PAYLOAD
from tests.kits.reporter import BOUNDED_RUN as RUN
from tests.kits.reporter import completed_holding_little

pytestmark = pytest.mark.protocol("§7")

TOKEN = "tok_bounds"


async def reported_to(app: Any) -> Settlement:
    """:func:`completed_holding_little` over a client, to ``app`` served locally."""
    with trio.fail_after(30):
        async with serving(app) as base, httpx.AsyncHTTPTransport() as client:
            return await completed_holding_little(Reporter(client, base, TOKEN))


async def delivered_holding_little(app: Any) -> None:
    """Report once to ``app``: delivered at the first attempt, holding little."""
    result = await reported_to(app)
    assert (result.kind, result.status) == ("delivered", 200)


async def test_an_endless_answer_is_cut_off_and_the_report_still_delivered() -> None:
    """A server (or something in front of it) that answers 200 and then streams a body
    of 256 MiB: the completion is delivered at the first attempt, and the harness
    never holds more than a bounded prefix of it (it closes the connection)."""
    chunk = b"x" * 65536

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        await read_body(receive)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(4096):  # hypercorn drops what is sent after a hang-up
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    await delivered_holding_little(app)


async def test_a_small_compressed_answer_is_never_inflated_in_memory() -> None:
    """A 2xx whose small gzip body inflates to 50 MiB (a hostile or broken proxy): the
    report is delivered and the harness never holds the inflated body (its memory
    grows by far less than that while the answer is handled)."""
    bomb = gzip.compress(b"\0" * (50 * 1024 * 1024), compresslevel=9)
    assert len(bomb) < 64 * 1024  # within what is read to keep the connection

    await delivered_holding_little(_answering(200, bomb, b"gzip"))


async def test_every_attempt_sends_the_same_json_bytes_with_its_type(
    autojump_clock: Any,
) -> None:
    """A report retried through a 503 sends byte-for-byte the same body each time (one
    encoding per report), compact UTF-8 JSON, with ``Content-Type: application/json``
    and its length; so does a timeline post."""
    seen: list[tuple[str, dict[str, str], bytes]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        body = await read_body(receive)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        seen.append((scope["path"], headers, body))
        status = 503 if len(seen) == 1 else 200
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    with trio.fail_after(60):
        async with serving(app) as base, httpx.AsyncHTTPTransport() as client:
            reporter = Reporter(client, base, TOKEN)
            result = await reporter.complete(RUN, PATH, PAYLOAD)
            events = [{"kind": "tool", "name": "Bash", "text": "ls ✓"}]
            assert await reporter.post_timeline(RUN, "/t", events)
    assert result.kind == "delivered"
    (_, first_headers, first), (_, second_headers, second), (_, tl_headers, tl) = seen
    assert first == second
    assert json.loads(first) == PAYLOAD
    assert "✓".encode() in first and b" " not in first.replace(b"h\xc3\xa9llo \xe2\x9c\x93 ", b"")
    for headers, body in ((first_headers, first), (second_headers, second), (tl_headers, tl)):
        assert headers["content-type"] == "application/json"
        assert headers["content-length"] == str(len(body))
    assert first_headers["idempotency-key"] == RUN
    assert json.loads(tl) == {"run_id": RUN, "events": events}


def _answering(status: int, body: bytes, coding: bytes) -> Any:
    """An app answering every report with ``status`` and ``body`` sent as ``coding``."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        await read_body(receive)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-encoding", coding),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return app


async def refused_holding_little(app: Any) -> str:
    """Report once to ``app`` (which refuses it), holding little: the line the person
    reads."""
    result = await reported_to(app)
    assert (result.kind, result.status) == ("rejected", 400)
    return result.detail


async def test_a_compressed_error_page_is_inflated_only_as_far_as_its_line_needs() -> None:
    """A 400 whose gzip body inflates to 50 MiB: the person still reads the start of
    the page, and the harness never holds the inflated body (httpx's decoder would
    inflate each compressed chunk whole)."""
    bomb = gzip.compress(b"quota exceeded for this machine " + b" " * (50 * 1024 * 1024),
                         compresslevel=9)
    assert len(bomb) < 64 * 1024
    detail = await refused_holding_little(_answering(400, bomb, b"gzip"))
    assert detail.endswith("400: quota exceeded for this machine"), detail


async def test_an_error_page_in_an_encoding_zlib_cannot_read_is_named_not_decoded() -> None:
    detail = await refused_holding_little(_answering(400, b"\x8b\x02\x80hello\x03", b"br"))
    assert detail.endswith("400: (a br-encoded body)"), detail
