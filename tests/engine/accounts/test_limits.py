"""Reading usage limits out of what the agent CLIs print (prohost.engine.agent.limits).

Every text here is one the real CLIs print (the sources are cited in
prohost/engine/agent/limits.py); ``now`` is fixed so "resets 8pm" has one right answer.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prohost.engine.accounts.limits import LimitNotice, merge
from prohost.engine.agent.brains.base import decode_json_line
from prohost.engine.agent.limits import (
    claude_limit_text,
    claude_rate_limit,
    codex_limit_text,
    codex_rate_limits,
    recover_events,
    reset_time,
)

pytestmark = pytest.mark.protocol("§12")

UTC = dt.UTC


def at(*parts: int) -> float:
    return dt.datetime(*parts, tzinfo=UTC).timestamp()


#: 2026-02-18 12:00 UTC.
NOW = at(2026, 2, 18, 12, 0)


# --- Claude's rate_limit_event -----------------------------------------------------

def test_rate_limit_statuses_map_to_states() -> None:
    allowed = claude_rate_limit({"status": "allowed", "resetsAt": 1774447200,
                                 "rateLimitType": "five_hour", "overageStatus": "rejected"})
    assert allowed == LimitNotice(state="ok", resets_at=1774447200,
                                  source="claude rate_limit_event five_hour")
    warning = claude_rate_limit({"status": "allowed_warning", "resetsAt": 1787590800,
                                 "rateLimitType": "seven_day", "utilization": 0.37})
    assert warning is not None and warning.state == "warning"
    assert warning.used_percent == pytest.approx(37.0)
    rejected = claude_rate_limit({"status": "rejected", "resetsAt": 1771390800})
    assert rejected is not None and rejected.state == "limited"
    assert rejected.resets_at == 1771390800


@pytest.mark.parametrize("info", [
    None, "x", [], {}, {"status": "maybe"}, {"status": 1},
])
def test_a_rate_limit_info_without_a_known_status_is_no_notice(info: object) -> None:
    assert claude_rate_limit(info) is None


def test_odd_figures_are_dropped_not_fatal() -> None:
    notice = claude_rate_limit({"status": "rejected", "resetsAt": "soon", "utilization": True})
    assert notice == LimitNotice(state="limited", source="claude rate_limit_event")
    millis = claude_rate_limit({"status": "rejected", "resetsAt": 1771390800000})
    assert millis is not None and millis.resets_at is None


# --- reset times -------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    # The next 10pm in New York (EST, UTC-5) after noon UTC is today's.
    ("10pm (America/New_York)", at(2026, 2, 19, 3, 0)),
    # 8:30pm in Tokyo has passed (it is 21:00 there): tomorrow's.
    ("8:30pm (Asia/Tokyo)", at(2026, 2, 19, 11, 30)),
    ("Apr 23 at 4pm (America/Recife)", at(2026, 4, 23, 19, 0)),
    # A date more than a day gone is next year's; Etc/GMT-9 is UTC+9.
    ("Jan 21, 5am (Etc/GMT-9)", at(2027, 1, 20, 20, 0)),
    ("12am (UTC)", at(2026, 2, 19, 0, 0)),
    ("12pm (UTC)", at(2026, 2, 19, 12, 0)),  # exactly now: the next one
    ("1:05 PM (UTC)", at(2026, 2, 18, 13, 5)),
    ("Sep 3rd, 2026 4:05 PM (UTC)", at(2026, 9, 3, 16, 5)),
    ("in 2 days 17 hours 14 minutes", NOW + 2 * 86400 + 17 * 3600 + 14 * 60),
])
def test_reset_times_in_the_clis_words(text: str, expected: float) -> None:
    assert reset_time(text, NOW) == expected


def test_a_reset_time_without_a_zone_is_local() -> None:
    local = dt.datetime.fromtimestamp(NOW).astimezone()
    expected = local.replace(hour=20, minute=0, second=0, microsecond=0)
    if expected.timestamp() <= NOW:
        expected += dt.timedelta(days=1)
    assert reset_time("8pm", NOW) == expected.timestamp()
    # An unknown zone is read as local time rather than dropped.
    assert reset_time("8pm (Mars/Olympus)", NOW) == expected.timestamp()


@pytest.mark.parametrize("text", ["soon", "13pm", "0am", "Feb 30 at 4pm (UTC)", "in a while", ""])
def test_an_unreadable_reset_time_is_none(text: str) -> None:
    assert reset_time(text, NOW) is None


# --- Claude's limit texts ----------------------------------------------------------

def test_the_legacy_claude_notice_carries_its_epoch() -> None:
    notice = claude_limit_text("Claude AI usage limit reached|1760000400", NOW)
    assert notice == LimitNotice(state="limited", resets_at=1760000400,
                                 source="claude usage limit reached")


@pytest.mark.parametrize(("text", "expected"), [
    ("You've hit your limit · resets 8pm (Europe/Paris)", at(2026, 2, 18, 19, 0)),
    ("You've hit your session limit · resets 8:30pm (Asia/Tokyo)", at(2026, 2, 19, 11, 30)),
    ("You’ve hit your limit · resets Apr 23 at 4pm (America/Recife)", at(2026, 4, 23, 19, 0)),
    ("You've hit your limit · resets 2pm (Europe/Budapest)\n"
     "/login to switch to an API usage-billed account.", at(2026, 2, 18, 13, 0)),
    ("Claude usage limit reached. Your limit will reset at 5pm (Europe/Warsaw).",
     at(2026, 2, 18, 16, 0)),
])
def test_the_newer_claude_notice_is_read_relative_to_now(text: str, expected: float) -> None:
    notice = claude_limit_text(text, NOW)
    assert notice is not None and notice.state == "limited"
    assert notice.resets_at == expected


def test_a_claude_notice_with_an_unreadable_time_is_limited_without_one() -> None:
    notice = claude_limit_text("You've hit your limit · resets whenever", NOW)
    assert notice == LimitNotice(state="limited", source="claude usage limit reached")


def test_a_reply_that_mentions_a_limit_is_not_a_notice_unless_the_cli_failed() -> None:
    reply = "Done. Note: if you see \"You've hit your limit\" later, wait for the reset."
    assert claude_limit_text(reply, NOW) is None
    assert claude_limit_text("All tests pass.", NOW, anywhere=True) is None
    failed = claude_limit_text("API Error: You've hit your limit · resets 8pm (UTC)", NOW,
                               anywhere=True)
    assert failed is not None and failed.resets_at == at(2026, 2, 18, 20, 0)


# --- Codex -------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("You've hit your usage limit. Try again at 1:05 PM (UTC).", at(2026, 2, 18, 13, 5)),
    ("You've hit your usage limit. Upgrade to Pro (https://openai.com/chatgpt/pricing), visit "
     "https://chatgpt.com/codex/settings/usage to purchase more credits or try again at "
     "Sep 3rd, 2026 4:05 PM (UTC).", at(2026, 9, 3, 16, 5)),
    ("You've hit your usage limit. Upgrade to Pro (https://openai.com/chatgpt/pricing) or try "
     "again in 2 days 17 hours 14 minutes.", NOW + 2 * 86400 + 17 * 3600 + 14 * 60),
    ("You've hit your usage limit. Try again later.", None),
    ("Quota exceeded. Check your plan and billing details.", None),
])
def test_codex_usage_limit_errors(text: str, expected: float | None) -> None:
    notice = codex_limit_text(text, NOW)
    assert notice is not None and notice.state == "limited"
    assert notice.resets_at == expected


def test_codex_local_clock_time_is_read_in_local_time() -> None:
    local = dt.datetime.fromtimestamp(NOW).astimezone()
    expected = local.replace(hour=14, minute=57, second=0, microsecond=0)
    if expected.timestamp() <= NOW:
        expected += dt.timedelta(days=1)
    notice = codex_limit_text("You've hit your usage limit. To get more access now, send a "
                              "request to your admin or try again at 2:57 PM.", NOW)
    assert notice is not None and notice.resets_at == expected.timestamp()


@pytest.mark.parametrize("text", [
    "Reconnecting... 2/5 (stream disconnected before completion)",
    "unexpected status 401 Unauthorized", "",
])
def test_other_codex_errors_are_not_limits(text: str) -> None:
    assert codex_limit_text(text, NOW) is None


def test_codex_rate_limit_figures() -> None:
    snapshot = {"primary": {"used_percent": 7.0, "window_minutes": 300, "resets_at": 1763483205},
                "secondary": {"used_percent": 77.0, "window_minutes": 10080,
                              "resets_at": 1763606387}}
    assert codex_rate_limits(snapshot, NOW) == LimitNotice(
        state="warning", resets_at=1763606387, used_percent=77.0,
        source="codex rate_limits secondary")
    older = {"primary": {"used_percent": 100.0, "window_minutes": 300,
                         "resets_in_seconds": 600}}
    assert codex_rate_limits(older, NOW) == LimitNotice(
        state="limited", resets_at=NOW + 600, used_percent=100.0,
        source="codex rate_limits primary")
    calm = codex_rate_limits({"primary": {"used_percent": 12}, "secondary": None}, NOW)
    assert calm is not None and calm.state == "ok" and calm.resets_at is None
    for junk in (None, {}, {"primary": "x"}, {"primary": {"used_percent": "12"}}):
        assert codex_rate_limits(junk, NOW) is None


# --- combining notices of one attempt ------------------------------------------------

def test_a_refusal_is_not_undone_by_a_later_milder_event() -> None:
    rejected = LimitNotice(state="limited", resets_at=100.0, source="a")
    allowed = LimitNotice(state="ok", resets_at=999.0, used_percent=12.0, source="b")
    combined = rejected.then(allowed)
    assert combined.state == "limited" and combined.resets_at == 100.0
    assert combined.used_percent == 12.0  # the figure is still news
    assert merge(None, allowed) == allowed and merge(allowed, None) == allowed


def test_a_later_notice_of_the_same_state_keeps_a_reset_the_earlier_one_knew() -> None:
    exact = LimitNotice(state="limited", resets_at=100.0, source="event")
    vague = LimitNotice(state="limited", source="text")
    assert exact.then(vague).resets_at == 100.0
    # But an "allowed" window's reset is not when a refusal ends.
    assert LimitNotice(state="ok", resets_at=5.0).then(vague).resets_at is None


# --- a rate_limit_event written into another line -------------------------------------

def test_an_embedded_rate_limit_event_is_split_out() -> None:
    event = {"type": "rate_limit_event", "rate_limit_info": {"status": "allowed"}}
    embedded = json.dumps(event, separators=(",", ":")).encode()
    head = b'{"type":"assistant","message":{"content":[{"type":"text","text":"part'
    rest, events = recover_events(head + embedded, decode_json_line)
    assert rest == head and events == [event]
    # Nothing embedded, or an embedded event that is itself broken: left alone.
    assert recover_events(head, decode_json_line) == (head, [])
    assert recover_events(head + embedded[:-1], decode_json_line) == (head + embedded[:-1], [])


# --- no text is ever fatal -----------------------------------------------------------------

@given(st.text(max_size=300), st.floats(min_value=0, max_value=4e9))
def test_no_text_makes_the_readers_raise(text: str, now: float) -> None:
    reset_time(text, now)
    claude_limit_text(text, now)
    claude_limit_text("You've hit your limit · resets " + text, now)
    codex_limit_text("You've hit your usage limit. Try again at " + text, now)


@given(st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(),
                    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
                    max_leaves=20))
def test_no_json_value_makes_the_figure_readers_raise(value: object) -> None:
    claude_rate_limit(value)
    claude_rate_limit({"status": "rejected", "resetsAt": value, "utilization": value})
    codex_rate_limits(value, NOW)
    codex_rate_limits({"primary": value, "secondary": {"used_percent": value}}, NOW)
