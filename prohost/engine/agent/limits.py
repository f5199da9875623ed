"""Usage limits as the agent CLIs report them, read into a
:class:`~prohost.engine.accounts.limits.LimitNotice`: pure parsing, no I/O, no clock.

Every function takes ``now`` (epoch seconds) when it needs one, so a reset time
written as "8pm" or "2:57 PM" is read relative to a moment the caller chose.
Nothing here raises on odd input: a text that cannot be read is simply not a
notice (or a notice without a reset time), never an error.

The shapes, with where each comes from:

* Claude Code stream-json ``rate_limit_event`` — ``{"type":"rate_limit_event",
  "rate_limit_info":{"status":"allowed_warning","resetsAt":1787590800,
  "rateLimitType":"seven_day","utilization":0.37,"isUsingOverage":false}}``
  (github.com/devblazer/dodona/issues/32; github.com/anthropics/claude-code/issues/38673
  shows ``"status":"allowed"`` with ``overageStatus``). ``status`` is ``allowed`` /
  ``allowed_warning`` / ``rejected``; ``utilization`` is a fraction of 1.
* Claude Code limit-reached texts — the older ``Claude AI usage limit
  reached|1760000400`` (github.com/anthropics/claude-code/issues/9046), the TUI's
  ``Claude usage limit reached. Your limit will reset at 5pm (Europe/Warsaw).``
  (issues/6119), and the newer ``You've hit your limit · resets 10pm
  (America/New_York)`` (issues/22946), ``You've hit your session limit · resets
  8:30pm (Asia/Tokyo)`` (issues/77082), ``… resets Apr 23 at 4pm (America/Recife)``
  (issues/51981), ``… resets Jan 21, 5am (Etc/GMT-9)`` (issues/18663), and without a
  zone ``… resets 7pm`` (issues/47878).
* Codex's usage-limit error — ``UsageLimitReachedError``'s Display in
  openai/codex ``codex-rs/core/src/error.rs``: ``You've hit your usage limit. …
  Try again at 2:57 PM.`` (same local day) or ``… try again at Sep 3rd, 2025 4:05
  PM.``, or ``Try again later.``; older builds said ``… try again in 2 days 17
  hours 14 minutes.`` (github.com/openai/codex/issues/3124). ``Quota exceeded. Check
  your plan and billing details.`` is ``CodexErr::QuotaExceeded``, which the same
  file maps to ``CodexErrorInfo::UsageLimitExceeded`` as well.
* Codex's rate-limit figures — ``RateLimitSnapshot`` in openai/codex
  ``codex-rs/protocol/src/protocol.rs``: ``{"primary":{"used_percent":7.0,
  "window_minutes":300,"resets_at":1763483205},"secondary":{…}}`` (older builds:
  ``resets_in_seconds`` instead of ``resets_at``), carried by ``token_count`` events.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping
from typing import Any
from zoneinfo import ZoneInfo

from prohost.engine.accounts.limits import LimitNotice, LimitState

#: Codex's own terminal UI starts warning about a window at this share used, in
#: percent (``RATE_LIMIT_WARNING_THRESHOLDS = [75.0, 90.0, 95.0]`` in openai/codex
#: ``codex-rs/tui/src/chatwidget.rs``); its figures carry no status of their own.
CODEX_WARNING_PERCENT = 75.0

#: A limit text longer than this is a reply that mentions a limit, not the CLI's
#: one-line notice (characters).
_NOTICE_CHARS = 400


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _epoch(value: object) -> float | None:
    number = _number(value)
    # Milliseconds by mistake would be a date tens of thousands of years away.
    return number if number is not None and 0 < number < 1e11 else None


def claude_rate_limit(info: object) -> LimitNotice | None:
    """A notice from Claude Code's ``rate_limit_info`` object, or ``None``."""
    if not isinstance(info, Mapping):
        return None
    # Only ``status`` says whether this request was refused: ``overageStatus``
    # "rejected" is the steady state of any account without extra-usage credits
    # and comes with "allowed" requests (github.com/shabaraba/vibing.nvim/pull/533,
    # github.com/smithersai/smithers/issues/1342).
    status = info.get("status")
    state: LimitState
    if status == "rejected":
        state = "limited"
    elif status == "allowed_warning":
        state = "warning"
    elif status == "allowed":
        state = "ok"
    else:
        return None
    used: float | None = None
    utilization = _number(info.get("utilization"))
    if utilization is not None and utilization >= 0:
        # A fraction of 1 (0.37 at 37 %); a value above 1 is taken as a percentage.
        used = utilization * 100 if utilization <= 1 else utilization
    kind = info.get("rateLimitType")
    source = "claude rate_limit_event" + (f" {kind}" if isinstance(kind, str) and kind else "")
    return LimitNotice(state=state, resets_at=_epoch(info.get("resetsAt")),
                       used_percent=used, source=source)


_MONTHS = {name: index for index, name in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
    start=1)}

# "Apr 23 at 4pm", "Jan 21, 5am", "Sep 3rd, 2025 4:05 PM", "8:30pm", "2:57 PM",
# each optionally followed by "(Europe/Paris)".
_WHEN = re.compile(
    r"(?:(?P<month>jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?\s+"
    r"(?P<day>\d{1,2})(?:st|nd|rd|th)?,?\s+(?:(?P<year>\d{4}),?\s+)?(?:at\s+)?)?"
    r"(?P<hour>\d{1,2})(?::(?P<minute>\d{2}))?\s*(?P<half>[ap])\.?m\.?"
    r"(?:\s*\((?P<zone>[A-Za-z0-9_+\-/]{1,64})\))?",
    re.IGNORECASE,
)
_IN = re.compile(
    r"\bin\s+(?P<span>(?:\d+\s*(?:days?|hours?|minutes?|mins?|seconds?|secs?)[\s,]*(?:and\s+)?)+)",
    re.IGNORECASE,
)
_SPAN_PART = re.compile(r"(\d+)\s*(d|h|m|s)", re.IGNORECASE)
_SPAN_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def _zone(name: str | None) -> dt.tzinfo | None:
    """The named IANA zone; ``None`` (the machine's local time) when absent or unknown."""
    if not name:
        return None
    try:
        return ZoneInfo(name)
    except (ValueError, KeyError, OSError):
        return None


def reset_time(text: str, now: float) -> float | None:
    """The first reset moment written in ``text``, as epoch seconds, or ``None``.

    A clock time alone ("8pm", "2:57 PM") is the next such moment after ``now``;
    with a month and day and no year it is this year's, or next year's when that
    is more than a day gone. Without a zone it is the machine's local time (both
    CLIs print local times). ``in 2 days 17 hours`` counts from ``now``.
    """
    match = _WHEN.search(text)
    if match is not None:
        return _clock(match, now)
    span = _IN.search(text)
    if span is not None:
        seconds = sum(int(count) * _SPAN_SECONDS[unit.lower()]
                      for count, unit in _SPAN_PART.findall(span["span"]))
        return now + seconds if seconds else None
    return None


def _clock(match: re.Match[str], now: float) -> float | None:
    hour, minute = int(match["hour"]), int(match["minute"] or 0)
    if not (1 <= hour <= 12 and 0 <= minute <= 59):
        return None
    hour = hour % 12 + (12 if match["half"].lower() == "p" else 0)
    zone = _zone(match["zone"])
    current = dt.datetime.fromtimestamp(now, zone).astimezone(zone)
    try:
        if match["month"]:
            month, day = _MONTHS[match["month"].lower()[:3]], int(match["day"])
            year = int(match["year"]) if match["year"] else current.year
            moment = current.replace(year=year, month=month, day=day, hour=hour,
                                     minute=minute, second=0, microsecond=0)
            if not match["year"] and moment.timestamp() < now - 86400:
                moment = moment.replace(year=year + 1)
        else:
            moment = current.replace(hour=hour, minute=minute, second=0, microsecond=0)
            if moment.timestamp() <= now:
                moment += dt.timedelta(days=1)
    except ValueError:  # "Feb 30"
        return None
    return moment.timestamp()


_CLAUDE_LEGACY = re.compile(r"Claude AI usage limit reached\|(?P<epoch>\d{9,11})")
_CLAUDE_HIT = re.compile(
    r"(?:you['’]ve|you have) hit your (?:[a-z\-]+ )?limit"
    r"|claude (?:ai )?usage limit reached",
    re.IGNORECASE,
)
_CLAUDE_RESETS = re.compile(r"\breset(?:s)?\b(?:\s+at)?\s+(?P<when>.*)", re.IGNORECASE)


def claude_limit_text(text: str, now: float, *, anywhere: bool = False) -> LimitNotice | None:
    """A ``limited`` notice when ``text`` is Claude Code's limit-reached message.

    By default the message must open the text (a result whose whole text is the
    notice); ``anywhere`` also finds it further in, for texts the CLI marked as
    errors. A reset time that cannot be read gives a notice without one.
    """
    text = text.strip()
    if not text or (len(text) > _NOTICE_CHARS and not anywhere):
        return None
    legacy = _CLAUDE_LEGACY.search(text)
    if legacy is not None and (anywhere or legacy.start() == 0):
        return LimitNotice(state="limited", resets_at=_epoch(int(legacy["epoch"])),
                           source="claude usage limit reached")
    hit = _CLAUDE_HIT.search(text)
    if hit is None or not (anywhere or hit.start() == 0):
        return None
    resets = _CLAUDE_RESETS.search(text, hit.end())
    at = reset_time(resets["when"], now) if resets is not None else None
    return LimitNotice(state="limited", resets_at=at, source="claude usage limit reached")


_CODEX_HIT = re.compile(
    r"you['’]ve hit your usage limit|quota exceeded\. check your plan and billing",
    re.IGNORECASE,
)
_CODEX_AGAIN = re.compile(r"try again (?P<when>(?:at|in)\s+.*)", re.IGNORECASE)


def codex_limit_text(text: str, now: float) -> LimitNotice | None:
    """A ``limited`` notice when ``text`` is Codex's usage-limit error, else ``None``."""
    hit = _CODEX_HIT.search(text)
    if hit is None:
        return None
    again = _CODEX_AGAIN.search(text, hit.end())
    at = reset_time(again["when"], now) if again is not None else None
    return LimitNotice(state="limited", resets_at=at, source="codex usage limit reached")


def codex_rate_limits(snapshot: object, now: float) -> LimitNotice | None:
    """A notice from Codex's ``rate_limits`` figures: the fullest window decides.

    100 % used is ``limited`` until that window resets; from
    :data:`CODEX_WARNING_PERCENT` it is a ``warning``; below, ``ok``.
    """
    if not isinstance(snapshot, Mapping):
        return None
    best: tuple[float, float | None, str] | None = None
    for name in ("primary", "secondary"):
        window = snapshot.get(name)
        if not isinstance(window, Mapping):
            continue
        used = _number(window.get("used_percent"))
        if used is None or used < 0:
            continue
        resets = _epoch(window.get("resets_at"))
        if resets is None:
            after = _number(window.get("resets_in_seconds"))
            resets = now + after if after is not None and after >= 0 else None
        if best is None or used > best[0]:
            best = (used, resets, name)
    if best is None:
        return None
    used, resets, name = best
    state: LimitState = (
        "limited" if used >= 100 else "warning" if used >= CODEX_WARNING_PERCENT else "ok"
    )
    return LimitNotice(state=state, resets_at=resets, used_percent=min(used, 100.0),
                       source=f"codex rate_limits {name}")


def recover_events(line: bytes, decode: Any) -> tuple[bytes, list[dict[str, Any]]]:
    """Split a line that has a ``rate_limit_event`` written into its middle.

    Claude Code 2.1.74 wrote a whole ``rate_limit_event`` line into the middle of
    another event (github.com/anthropics/claude-code/issues/49640): the stream then
    shows ``{"type":"assistant",…"text":"partial{"type":"rate_limit_event",…}``
    and, on the next line, the rest of the assistant event. Returns the head
    before the embedded event (to be joined with the next line) and the events
    that could be decoded from the tail. ``decode`` is the JSON-line decoder.
    """
    marker = line.find(b'{"type":"rate_limit_event"')
    if marker <= 0:
        return line, []
    event = decode(line[marker:])
    if event is None:
        return line, []
    return line[:marker], [event]
