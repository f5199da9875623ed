"""Completion and timeline posting (docs/protocol.md §7, §8) against a real HTTP server.

The server is hypercorn on 127.0.0.1 port 0 in the test's own nursery, serving a
tiny scripted ASGI app that records every request with the trio time it arrived.
Everything runs in one trio run under ``autojump_clock``, so ten minutes of retries
take no real time.
"""

from __future__ import annotations

import email.utils
import json
import logging
import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio

from prohost.engine.report.reporter import Reporter, Settlement
from tests.kits.asgi import serving
from tests.kits.reporter import (
    HANG,
    PATH,
    PAYLOAD,
    RUN,
    TOKEN,
    FixedRandom,
    ScriptedApp,
    free_port,
    gaps,
)

pytestmark = pytest.mark.protocol("§7")


@asynccontextmanager
async def reporter_for(
    app: ScriptedApp, **kwargs: Any
) -> AsyncIterator[tuple[Reporter, httpx.AsyncHTTPTransport]]:
    async with serving(app) as base, httpx.AsyncHTTPTransport() as client:
        yield Reporter(client, base, TOKEN, **kwargs), client


async def test_delivered_first_time_with_headers_and_exact_body(autojump_clock: Any) -> None:
    with trio.fail_after(60):
        app = ScriptedApp((200, {}, b"{}"))
        async with reporter_for(app) as (reporter, _):
            result = await reporter.complete(RUN, PATH, PAYLOAD)
        assert result == Settlement(kind="delivered", status=200, detail="200")
        [seen] = app.seen
        assert (seen.method, seen.path) == ("POST", PATH)
        assert seen.headers["authorization"] == f"Bearer {TOKEN}"
        assert seen.headers["idempotency-key"] == RUN
        assert seen.headers["content-type"] == "application/json"
        assert json.loads(seen.body) == PAYLOAD


async def test_503_then_200_is_delivered_after_one_retry(autojump_clock: Any) -> None:
    with trio.fail_after(60):
        app = ScriptedApp((503, {}, b"busy"), (200, {}, b""))
        async with reporter_for(app, rng=FixedRandom()) as (reporter, _):
            result = await reporter.complete(RUN, PATH, PAYLOAD)
        assert result.kind == "delivered"
        assert len(app.seen) == 2
        assert gaps(app.times) == [1.0]
        # Same key on the retry: that is what makes retrying a POST safe.
        assert {s.headers["idempotency-key"] for s in app.seen} == {RUN}


async def test_retry_after_seconds_is_honoured(autojump_clock: Any) -> None:
    with trio.fail_after(60):
        app = ScriptedApp((429, {"Retry-After": "7"}, b"slow down"), (200, {}, b""))
        async with reporter_for(app, rng=FixedRandom()) as (reporter, _):
            result = await reporter.complete(RUN, PATH, PAYLOAD)
        assert result.kind == "delivered"
        assert app.times[1] - app.times[0] >= 7


async def test_retry_after_http_date_is_honoured(autojump_clock: Any) -> None:
    with trio.fail_after(120):
        # Wall-clock date (the header's unit), 20 s ahead; whole seconds only.
        when = email.utils.formatdate(time.time() + 20, usegmt=True)
        app = ScriptedApp((503, {"Retry-After": when}, b""), (200, {}, b""))
        async with reporter_for(app, rng=FixedRandom()) as (reporter, _):
            result = await reporter.complete(RUN, PATH, PAYLOAD)
        assert result.kind == "delivered"
        assert 18 <= app.times[1] - app.times[0] <= 21


async def test_retry_after_beyond_the_window_gives_up_at_the_window(autojump_clock: Any) -> None:
    with trio.fail_after(200):
        app = ScriptedApp((503, {"Retry-After": "120"}, b""))
        async with reporter_for(app, window_s=60) as (reporter, _):
            start = trio.current_time()
            result = await reporter.complete(RUN, PATH, PAYLOAD)
            took = trio.current_time() - start
        assert result.kind == "gave_up"
        assert result.status == 503
        assert len(app.seen) == 1
        assert took == pytest.approx(60)


async def test_408_is_retried(autojump_clock: Any) -> None:
    with trio.fail_after(60):
        app = ScriptedApp((408, {}, b""), (200, {}, b""))
        async with reporter_for(app) as (reporter, _):
            assert (await reporter.complete(RUN, PATH, PAYLOAD)).kind == "delivered"
        assert len(app.seen) == 2


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [(409, b"already completed", "already"), (404, b"no such run", "closed")],
    ids=["409-already", "404-closed"],
)
async def test_409_and_404_settle_at_the_first_answer(
    autojump_clock: Any, status: int, body: bytes, kind: str
) -> None:
    with trio.fail_after(60):
        app = ScriptedApp((status, {}, body))
        async with reporter_for(app) as (reporter, _):
            result = await reporter.complete(RUN, PATH, PAYLOAD)
        assert (result.kind, result.status) == (kind, status)
        assert len(app.seen) == 1


async def test_400_is_rejected_with_a_bounded_body_snippet(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with trio.fail_after(60):
        body = b'{"error": "reply too long"}\n' + b"x" * 100_000
        app = ScriptedApp((400, {}, body))
        with caplog.at_level(logging.INFO, logger="prohost.reporter"):
            async with reporter_for(app) as (reporter, _):
                result = await reporter.complete(RUN, PATH, PAYLOAD)
        assert (result.kind, result.status) == ("rejected", 400)
        assert result.detail.startswith('400: {"error": "reply too long"} xxx')
        assert len(result.detail) < 300
        assert "\n" not in result.detail
        assert len(app.seen) == 1
        assert "reply too long" in caplog.text


@pytest.mark.protocol("§1")
async def test_token_echoed_by_the_server_never_reaches_detail_or_log(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with trio.fail_after(60):
        app = ScriptedApp((401, {}, f"bad token {TOKEN}".encode()))
        with caplog.at_level(logging.DEBUG):
            async with reporter_for(app) as (reporter, _):
                result = await reporter.complete(RUN, PATH, PAYLOAD)
        assert result.kind == "rejected"
        assert "bad token" in result.detail
        assert TOKEN not in result.detail
        assert TOKEN not in caplog.text


async def test_redirect_is_not_followed(autojump_clock: Any) -> None:
    with trio.fail_after(60):
        app = ScriptedApp((307, {"Location": "/steal"}, b""), (200, {}, b""))
        # Followed, it would carry the token somewhere the completion path was
        # validated not to go.
        async with serving(app) as base, httpx.AsyncHTTPTransport() as client:
            result = await Reporter(client, base, TOKEN).complete(RUN, PATH, PAYLOAD)
        assert (result.kind, result.status) == ("rejected", 307)
        assert len(app.seen) == 1


async def test_always_503_gives_up_after_the_window(autojump_clock: Any) -> None:
    with trio.fail_after(700):
        app = ScriptedApp((503, {}, b"down"))
        async with reporter_for(app, rng=FixedRandom()) as (reporter, _):
            start = trio.current_time()
            result = await reporter.complete(RUN, PATH, PAYLOAD)
            took = trio.current_time() - start
        assert (result.kind, result.status) == ("gave_up", 503)
        assert took == pytest.approx(600)
        # 1 s doubling, capped at 30 s; the attempt due at 601 s is never made.
        expected = [1.0, 2.0, 4.0, 8.0, 16.0] + [30.0] * 18
        assert gaps(app.times) == expected
        assert app.times[-1] - start < 600


async def test_jitter_stays_within_half_to_full_backoff(autojump_clock: Any) -> None:
    with trio.fail_after(700):
        app = ScriptedApp((500, {}, b""))
        async with reporter_for(app, rng=random.Random(7), window_s=200) as (reporter, _):
            result = await reporter.complete(RUN, PATH, PAYLOAD)
        assert result.kind == "gave_up"
        nominal = [1.0, 2.0, 4.0, 8.0, 16.0] + [30.0] * 20
        observed = gaps(app.times)
        assert len(observed) >= 6
        for gap, n in zip(observed, nominal, strict=False):
            assert n / 2 <= gap <= n
        assert len(set(observed)) > 1  # it is actually jittered


async def test_connection_refused_is_retried_then_gives_up(autojump_clock: Any) -> None:
    with trio.fail_after(200):
        attempts: list[float] = []

        class Counted(httpx.AsyncHTTPTransport):
            """Notes when each attempt is made."""

            async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
                attempts.append(trio.current_time())
                return await super().handle_async_request(request)

        async with Counted() as client:
            reporter = Reporter(
                client, f"http://127.0.0.1:{free_port()}", TOKEN, window_s=60, rng=FixedRandom()
            )
            start = trio.current_time()
            result = await reporter.complete(RUN, PATH, PAYLOAD)
            took = trio.current_time() - start
        assert (result.kind, result.status) == ("gave_up", None)
        assert "ConnectError" in result.detail
        assert took == pytest.approx(60)
        assert gaps(attempts) == [1.0, 2.0, 4.0, 8.0, 16.0]  # the next is due at 61 s


async def test_a_hanging_server_counts_as_a_network_error(autojump_clock: Any) -> None:
    with trio.fail_after(200):
        app = ScriptedApp(HANG, (200, {}, b""))
        async with reporter_for(app, rng=FixedRandom()) as (reporter, _):
            start = trio.current_time()
            result = await reporter.complete(RUN, PATH, PAYLOAD)
            took = trio.current_time() - start
        assert result.kind == "delivered"
        assert len(app.seen) == 2
        # The 30 s per-request budget, then the first 1 s backoff.
        assert took == pytest.approx(31)


async def test_cancelling_complete_stops_retrying(autojump_clock: Any) -> None:
    with trio.fail_after(200):
        app = ScriptedApp((503, {}, b""))
        async with reporter_for(app, rng=FixedRandom()) as (reporter, _):
            with trio.move_on_after(10) as scope:
                await reporter.complete(RUN, PATH, PAYLOAD)
            assert scope.cancelled_caught
            seen = len(app.seen)
            await trio.sleep(100)
            assert len(app.seen) == seen == 4  # at 0, 1, 3, 7 s; nothing after


@pytest.mark.protocol("§8")
async def test_timeline_post_success(autojump_clock: Any) -> None:
    with trio.fail_after(60):
        app = ScriptedApp((204, {}, b""))
        events = [
            {"id": "toolu_1", "name": "Bash", "state": "calling", "summary": "pytest -q", "at": 1.5}
        ]
        async with reporter_for(app) as (reporter, _):
            assert await reporter.post_timeline(RUN, f"/v1/agent/runs/{RUN}/timeline", events)
        [seen] = app.seen
        assert seen.path == f"/v1/agent/runs/{RUN}/timeline"
        assert seen.headers["authorization"] == f"Bearer {TOKEN}"
        assert json.loads(seen.body) == {"run_id": RUN, "events": events}


@pytest.mark.protocol("§8")
async def test_timeline_post_failure_returns_false_after_two_tries(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with trio.fail_after(60):
        app = ScriptedApp((502, {}, b""))
        with caplog.at_level(logging.WARNING, logger="prohost.reporter"):
            async with reporter_for(app) as (reporter, _):
                assert not await reporter.post_timeline(RUN, "/t", [])
        assert len(app.seen) == 2
        assert "timeline for run_01" in caplog.text


@pytest.mark.protocol("§8")
async def test_timeline_post_4xx_is_not_retried(autojump_clock: Any) -> None:
    with trio.fail_after(60):
        app = ScriptedApp((404, {}, b""))
        async with reporter_for(app) as (reporter, _):
            assert not await reporter.post_timeline(RUN, "/t", [])
        assert len(app.seen) == 1


@pytest.mark.protocol("§8")
async def test_timeline_post_to_nobody_never_raises(autojump_clock: Any) -> None:
    with trio.fail_after(60):
        async with httpx.AsyncHTTPTransport() as client:
            reporter = Reporter(client, f"http://127.0.0.1:{free_port()}", TOKEN)
            start = trio.current_time()
            assert not await reporter.post_timeline(RUN, "/t", [{"id": "x"}])
            assert trio.current_time() - start < 15


@pytest.mark.protocol("§8")
async def test_timeline_post_to_a_hanging_server_is_bounded(autojump_clock: Any) -> None:
    with trio.fail_after(60):
        app = ScriptedApp(HANG)
        async with reporter_for(app) as (reporter, _):
            start = trio.current_time()
            assert not await reporter.post_timeline(RUN, "/t", [])
            assert trio.current_time() - start == pytest.approx(10.5)


@pytest.mark.parametrize(
    "retry_after",
    ["0", "-5", email.utils.formatdate(time.time() - 3600, usegmt=True)],
    ids=["zero", "negative", "past-date"],
)
async def test_retry_after_never_brings_a_retry_sooner_than_one_second(
    autojump_clock: Any, retry_after: str
) -> None:
    """`Retry-After: 0` (or a negative one, or a date in the past) must not make the
    reporter retry back to back: over a 60 s window, at most 60 attempts, each at
    least 1 s after the last (§7)."""
    with trio.fail_after(120):
        # 100 refusals, then 200: back-to-back retries would reach the 200 at once.
        app = ScriptedApp(*[(503, {"Retry-After": retry_after}, b"busy")] * 100,
                          (200, {}, b""))
        async with reporter_for(app, window_s=60) as (reporter, _):
            result = await reporter.complete(RUN, PATH, PAYLOAD)
        assert result.kind == "gave_up"
        assert 2 <= len(app.seen) <= 61
        assert min(gaps(app.times)) >= 1.0


@pytest.mark.parametrize("retry_after", ["\u00b2", "\u00b3\u00b9", "1.5", "soon"])
async def test_a_retry_after_that_is_no_number_falls_back_to_the_backoff(
    autojump_clock: Any, retry_after: str,
) -> None:
    """A hostile or broken ``Retry-After`` (header bytes are latin-1, where 0xB2 is
    "²", a digit to ``isdigit()`` and a ValueError to ``float()``) is read as none:
    the reporter backs off on its own and the completion is still delivered."""
    with trio.fail_after(60):
        app = ScriptedApp((503, {"Retry-After": retry_after}, b"busy"), (200, {}, b""))
        async with reporter_for(app) as (reporter, _):
            result = await reporter.complete(RUN, PATH, PAYLOAD)
        assert result.kind == "delivered"
        assert len(app.seen) == 2


async def test_post_once_makes_exactly_one_attempt(autojump_clock: Any) -> None:
    """The outbox's attempt: one POST, a transient failure is not settled."""
    with trio.fail_after(60):
        app = ScriptedApp((503, {"Retry-After": "0"}, b"busy"), (200, {}, b""))
        async with reporter_for(app) as (reporter, _):
            first = await reporter.post_once(RUN, PATH, PAYLOAD)
            assert (first.kind, first.status, len(app.seen)) == ("gave_up", 503, 1)
            second = await reporter.post_once(RUN, PATH, PAYLOAD)
        assert (second.kind, len(app.seen)) == ("delivered", 2)
