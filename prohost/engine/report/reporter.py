"""Posting a run's result, and its timeline, to the server (docs/protocol.md §7, §8).

A completion is the only thing the person waiting in the thread sees, so it is
retried through the kinds of failure that pass on their own (a restarting server,
a rate limit, a dropped connection) for a bounded window, and settled at once on
the answers that will not change (2xx, 409 already completed, 404 closed, any other
4xx). Every attempt carries ``Idempotency-Key: <run_id>``, which is what makes
retrying a POST safe: a server that got the first attempt but whose answer was lost
takes the second as the same report.

A report the window could not settle is not lost: the caller keeps it in the
ledger's outbox and tries it again with :meth:`Reporter.post_once`
(:mod:`prohost.engine.report.outbox`). No retry comes sooner than 1 s after the last
attempt, whatever ``Retry-After`` says.

The window is measured on trio's clock, so tests run ten minutes of retries in
virtual time. The token goes in one header and nowhere else: it is scrubbed from
every line this module logs or returns, including echoes of it in a response body.
"""

from __future__ import annotations

import email.utils
import json
import logging
import math
import random
import time
from typing import Any, Literal

import attrs
import httpx
import trio

from prohost.engine.report.sender import CLIENT_HEADERS, Sender
from prohost.engine.report.snippet import SNIPPET_CHARS, read_snippet

__all__ = ["Reporter", "Settlement"]

SettlementKind = Literal["delivered", "already", "closed", "rejected", "gave_up"]

#: The media type of every body posted.
JSON_TYPE = "application/json"

#: How long a completion is retried, from its first attempt (§7).
DEFAULT_WINDOW_S = 600.0
#: One attempt's budget, end to end: a server that accepts and never answers is a
#: network error, not a reason to hold the run in `reporting` for the whole window.
REQUEST_TIMEOUT_S = 30.0
#: The first retry's nominal delay, in seconds; it doubles on each retry after.
BACKOFF_FIRST_S = 1.0
#: The longest nominal delay between two completion attempts, in seconds.
BACKOFF_CAP_S = 30.0
#: No retry comes sooner than this after the last attempt, in seconds, whatever
#: ``Retry-After`` says (§7): ``Retry-After: 0`` or a date in the past would otherwise
#: have the harness hammer a struggling server back to back for the whole window.
RETRY_FLOOR_S = 1.0
#: A body up to this many bytes is read to its end so the connection is kept (bytes).
DRAIN_BYTES = 64 * 1024

#: One timeline attempt's budget, end to end, in seconds.
TIMELINE_TIMEOUT_S = 5.0
#: Timeline posts are best effort: this many attempts at most.
TIMELINE_ATTEMPTS = 2
#: The pause between two timeline attempts, in seconds.
TIMELINE_PAUSE_S = 0.5

#: Statuses that pass on their own (besides every 5xx): request timeout, rate limit.
_RETRY_STATUSES = frozenset({408, 429})


@attrs.frozen
class Settlement:
    """How a completion report ended.

    ``delivered``: 2xx. ``already``: 409, the server already has a completion.
    ``closed``: 404, the run was closed server-side. ``rejected``: another 4xx (or
    an answer that retrying cannot change): failed-to-report. ``gave_up``: the
    retry window ran out (or :meth:`Reporter.post_once`'s one attempt failed in a
    way that passes on its own): the report is not settled, it waits in the outbox.
    ``detail`` is one short line for logs, without the token.
    """

    kind: SettlementKind
    status: int | None
    detail: str


@attrs.frozen
class _Answer:
    status: int | None  # None: no HTTP answer (network error or timeout)
    line: str
    retry_after: float | None = None
    fatal: bool = False  # no retry can change it (a bad URL)

    @property
    def retryable(self) -> bool:
        """Worth another try: no answer at all, or a status that passes on its own."""
        if self.fatal:
            return False
        return self.status is None or _retryable(self.status)


class Reporter:
    """Completions and timeline events for one server, over one :data:`Sender`.

    The sender is the caller's (its lifetime is the harness's), so connections are
    pooled across runs. A transport gets each request as it is built here; a client
    sends it with whatever it was configured with (a proxy, event hooks).
    """

    def __init__(
        self,
        sender: Sender,
        api_base: str,
        token: str,
        *,
        window_s: float = DEFAULT_WINDOW_S,
        rng: random.Random | None = None,
        log: logging.Logger | None = None,
    ) -> None:
        self._sender = sender
        # completion_path always starts with "/" (runs.path_problem), so a
        # trailing slash here would make "//v1/...".
        self._base = api_base.rstrip("/")
        self._token = token
        self._window_s = window_s
        self._rng = rng if rng is not None else random.Random()
        self._log = log if log is not None else logging.getLogger("prohost.reporter")

    # -- completion ---------------------------------------------------------

    async def complete(
        self, run_id: str, completion_path: str, payload: dict[str, Any]
    ) -> Settlement:
        """POST the completion, retrying transient failures for up to ``window_s``.

        Returns how the report settled; never raises for an HTTP or network
        failure. Cancelled: it stops where it is (mid-request or mid-backoff) and
        the cancellation propagates; nothing is recorded here, so the ledger's
        saved outcome is still the outbox to post from next time.
        """
        url, headers = self._completion_request(run_id, completion_path)
        # Encoded once for every attempt of this report: a reply may be up to 1 MiB.
        content = _encode(payload)
        deadline = trio.current_time() + self._window_s
        attempt = 0
        while True:
            attempt += 1
            # The first attempt always gets its whole budget (a window of 0 means
            # "one attempt"); later ones never run past the window.
            budget = REQUEST_TIMEOUT_S if attempt == 1 else \
                min(REQUEST_TIMEOUT_S, deadline - trio.current_time())
            answer = await self._post(url, headers, content, budget_s=budget, read_body=True)
            settled = self._settled(run_id, answer)
            if settled is not None:
                return settled
            what = answer.line
            delay = self._backoff(attempt) if answer.retry_after is None else answer.retry_after
            delay = max(RETRY_FLOOR_S, delay)
            remaining = deadline - trio.current_time()
            if delay >= remaining:
                # No attempt may start after the window; waiting out the rest of it
                # keeps "gave up" meaning exactly "window_s after the first try".
                self._log.warning(
                    "completion for %s: %s; next try would fall after the %.0f s window, "
                    "giving up in %.1f s",
                    run_id,
                    what,
                    self._window_s,
                    max(remaining, 0.0),
                )
                await trio.sleep_until(deadline)
                return self._settle(
                    run_id,
                    "gave_up",
                    answer.status,
                    f"gave up after {attempt} attempts in {self._window_s:.0f} s; last: {what}",
                    # Not an error yet: the outcome waits in the ledger's outbox.
                    logging.WARNING,
                )
            self._log.warning(
                "completion for %s: %s; retry %d in %.1f s", run_id, what, attempt, delay
            )
            await trio.sleep(delay)

    async def post_once(
        self, run_id: str, completion_path: str, payload: dict[str, Any]
    ) -> Settlement:
        """One attempt at the completion, for a report that waits in the outbox (§7).

        A transient failure is ``gave_up`` (``status`` None: no HTTP answer at all,
        the server is unreachable), logged at warning; the other kinds as for
        :meth:`complete`. Never raises for an HTTP or network failure. Cancelled:
        the request is abandoned and the cancellation propagates.
        """
        url, headers = self._completion_request(run_id, completion_path)
        answer = await self._post(url, headers, _encode(payload), budget_s=REQUEST_TIMEOUT_S,
                                  read_body=True)
        settled = self._settled(run_id, answer)
        if settled is not None:
            return settled
        return self._settle(run_id, "gave_up", answer.status, answer.line, logging.WARNING)

    def _completion_request(self, run_id: str, completion_path: str) -> tuple[str, dict[str, str]]:
        url = self._base + completion_path
        headers = {
            "Authorization": f"Bearer {self._token}",
            "Idempotency-Key": run_id,
            "Content-Type": JSON_TYPE,
        }
        return url, headers

    def _settled(self, run_id: str, answer: _Answer) -> Settlement | None:
        """How ``answer`` settles the report, or None when it is worth another try."""
        status, what = answer.status, answer.line
        if status is not None and 200 <= status < 300:
            return self._settle(run_id, "delivered", status, f"{status}", logging.DEBUG)
        if status == 409:
            return self._settle(run_id, "already", status, "409: already completed", logging.INFO)
        if status == 404:
            return self._settle(run_id, "closed", status, "404: run closed server-side",
                                logging.INFO)
        if not answer.retryable:
            # Other 4xx, and the odd 3xx (redirects are not followed).
            return self._settle(run_id, "rejected", status, what, logging.ERROR)
        return None

    async def _post(
        self,
        url: str,
        headers: dict[str, str],
        content: bytes,
        *,
        budget_s: float,
        read_body: bool,
    ) -> _Answer:
        """One POST of the JSON ``content``, reduced to what a retry loop needs; the
        loops differ, this does not.

        ``read_body``: on an answer other than 2xx, 404 or 409, read a bounded
        snippet of the body into the line and honour ``Retry-After`` (a completion:
        the line is what the person debugging a rejected report gets). Off, only a
        small body is read (a timeline post: the body is of no use). Whatever the
        server sends, at most DRAIN_BYTES of it are read: a larger answer closes
        the connection instead. Never raises for an HTTP or network failure.
        Cancelled: the request is abandoned where it stands and the cancellation
        propagates.
        """
        # httpx's own timeouts are per phase (connect, each read, ...), so a server
        # trickling a byte at a time would never trip them; the trio deadline bounds
        # the whole exchange. Both are set: a client's defaults don't apply, and a bare
        # transport has no timeout of its own.
        with trio.move_on_after(budget_s):
            try:
                response = await self._send(url, headers, content, _timeout(budget_s))
                try:
                    status = response.status_code
                    if not read_body or 200 <= status < 300 or status in (404, 409):
                        await _drain_small(response)
                        return _Answer(status, str(status))
                    snippet = await read_snippet(response)
                    line = f"{status}: {snippet}" if snippet else str(status)
                    return _Answer(
                        status,
                        self._scrub(line),
                        retry_after=_parse_retry_after(response.headers.get("retry-after")),
                    )
                finally:
                    # Read to its end, this keeps the connection for the next POST;
                    # else it closes it.
                    await response.aclose()
            except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
                # A bad api base: no retry can fix it, and it is not the network's fault.
                return _Answer(None, self._scrub(f"bad URL: {exc}"), fatal=True)
            except httpx.TransportError as exc:
                return _Answer(None, self._scrub(_describe_transport_error(exc)))
        return _Answer(None, f"no answer within {budget_s:.1f} s")

    async def _send(
        self, url: str, headers: dict[str, str], content: bytes, per_phase: httpx.Timeout
    ) -> httpx.Response:
        """The answer's status and headers, its body still unread: a hostile answer
        of any size is never read whole. Raises httpx's errors. Cancelled: the
        request is abandoned and the cancellation propagates."""
        # A transport never follows a redirect (which would carry the token somewhere
        # the path was validated not to go), keeps no cookie and runs no auth flow:
        # the request goes as built (sender.py says why).
        return await self._sender.handle_async_request(httpx.Request(
            "POST", url, content=content, headers=[*CLIENT_HEADERS, *headers.items()],
            extensions={"timeout": per_phase.as_dict()}))

    def _backoff(self, attempt: int) -> float:
        """1 s doubling to a 30 s cap, with equal jitter: half fixed, half random.

        The fixed half keeps retries from hammering a struggling server; the random
        half keeps many harnesses that lost it at the same moment from coming back
        in step.
        """
        nominal = min(BACKOFF_CAP_S, BACKOFF_FIRST_S * 2.0 ** min(attempt - 1, 32))
        return nominal / 2 + self._rng.random() * nominal / 2

    def _settle(
        self, run_id: str, kind: SettlementKind, status: int | None, detail: str, level: int
    ) -> Settlement:
        detail = self._scrub(detail)
        self._log.log(level, "completion for %s: %s (%s)", run_id, kind, detail)
        return Settlement(kind=kind, status=status, detail=detail)

    def _scrub(self, text: str) -> str:
        return text.replace(self._token, "<token>") if self._token else text

    # -- timeline -------------------------------------------------------------

    async def post_timeline(
        self, run_id: str, timeline_path: str, events: list[dict[str, Any]]
    ) -> bool:
        """POST timeline events, best effort: at most two quick attempts.

        Returns True on a 2xx, False otherwise (logged at warning); never raises
        for an HTTP or network failure, and never takes more than about 11 s.
        Cancelled: stops at once and the cancellation propagates.
        """
        url = self._base + timeline_path
        headers = {"Authorization": f"Bearer {self._token}", "Content-Type": JSON_TYPE}
        # Encoded once for both attempts.
        content = _encode({"run_id": run_id, "events": events})
        answer = _Answer(None, "not tried")
        for attempt in range(1, TIMELINE_ATTEMPTS + 1):
            if attempt > 1:
                await trio.sleep(TIMELINE_PAUSE_S)
            answer = await self._post(
                url, headers, content, budget_s=TIMELINE_TIMEOUT_S, read_body=False
            )
            if answer.status is not None and 200 <= answer.status < 300:
                return True
            if not answer.retryable:
                break
        self._log.warning(
            "timeline for %s: %d event(s) not posted (%s)", run_id, len(events), answer.line
        )
        return False


def _retryable(status: int) -> bool:
    return status in _RETRY_STATUSES or 500 <= status < 600


def _encode(payload: dict[str, Any]) -> bytes:
    """The request body, as httpx's ``json=`` would encode it (compact UTF-8)."""
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"),
                      allow_nan=False).encode("utf-8")


#: The timeout of a request with the whole budget (nearly all of them), made once.
_FULL_TIMEOUT = httpx.Timeout(REQUEST_TIMEOUT_S)


def _timeout(budget_s: float) -> httpx.Timeout:
    return _FULL_TIMEOUT if budget_s == REQUEST_TIMEOUT_S else httpx.Timeout(budget_s)


async def _drain_small(response: httpx.Response) -> None:
    """Read a short body to its end, so that httpx can keep the connection for the
    next POST (a response closed unread closes its connection, and every run then
    paid for a new TCP connection). A body over DRAIN_BYTES is left unread: the
    connection is closed instead, which is cheaper than reading it."""
    read = 0
    try:
        # Raw: the bytes as sent, never inflated (a small compressed answer can
        # inflate to any size), and no decoder to set up for a body nobody reads.
        async for chunk in response.aiter_raw():
            read += len(chunk)
            if read > DRAIN_BYTES:
                return
    except httpx.HTTPError:
        pass  # the status is the answer; a broken body only costs the connection


def _parse_retry_after(value: str | None) -> float | None:
    """Retry-After as seconds from now: delta-seconds or an HTTP date (RFC 9110 §10.2.3).

    An HTTP date is wall-clock, so it is turned into a delay against the wall
    clock, and that delay is then slept on trio's clock. Unparseable → None (fall
    back to our own backoff).
    """
    if value is None:
        return None
    value = value.strip()
    # ASCII only: a header's bytes arrive as latin-1, where "²" (0xB2) is a digit to
    # isdigit() and a ValueError to float(): a hostile answer must not raise here.
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    seconds = when.timestamp() - time.time()
    if math.isnan(seconds):
        return None
    return max(0.0, seconds)


def _describe_transport_error(exc: httpx.TransportError) -> str:
    # str(exc) is often empty for timeouts and resets; the class name still says
    # which (ConnectError, ReadTimeout, RemoteProtocolError, ...).
    text = " ".join(str(exc).split())
    name = type(exc).__name__
    line = f"{name}: {text}" if text else name
    return line[:SNIPPET_CHARS]
