"""Choosing an agent account for a run and tracking its limits (docs/protocol.md §12)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prohost.engine.accounts.book import (
    DEFAULT_ACCOUNT,
    UNKNOWN_RESET_S,
    Account,
    AccountBook,
    AccountError,
)
from prohost.engine.accounts.limits import LimitNotice

pytestmark = pytest.mark.protocol("§12")

T0 = 1_771_416_000.0


def book(*names: str) -> AccountBook:
    return AccountBook(Account(name, Path(f"/accounts/{name}")) for name in names)


def pick(accounts: AccountBook, now: float, **options: object) -> str | None:
    """The name of the account ``choose`` gives, or None."""
    chosen = accounts.choose(now, **options)  # type: ignore[arg-type]
    return None if chosen is None else chosen.name


def limited(resets_at: float | None = None) -> LimitNotice:
    return LimitNotice(state="limited", resets_at=resets_at, source="test")


def test_without_accounts_there_is_one_default_that_changes_no_environment() -> None:
    accounts = AccountBook()
    chosen = accounts.choose(T0)
    assert chosen == Account(DEFAULT_ACCOUNT) and chosen.env("claude") == {}
    assert accounts.snapshot(T0) == [
        {"name": "default", "state": "ok", "resets_at": None, "used_percent": None}]


def test_an_account_points_each_brain_at_its_folder() -> None:
    work = Account("work", Path("/home/me/.claude-work"))
    assert work.env("claude") == {"CLAUDE_CONFIG_DIR": "/home/me/.claude-work",
                                  "PROHOST_ACCOUNT_DIR": "/home/me/.claude-work"}
    assert work.env("codex") == {"CODEX_HOME": "/home/me/.claude-work",
                                 "PROHOST_ACCOUNT_DIR": "/home/me/.claude-work"}
    assert work.env("plain") == {"PROHOST_ACCOUNT_DIR": "/home/me/.claude-work"}


@pytest.mark.skipif(sys.platform == "darwin", reason="macOS keeps the login in the Keychain")
def test_each_conversation_gets_a_cli_folder_of_its_own_sharing_the_account_s_login() -> None:
    """Issue 36, attack 10: CLAUDE_CONFIG_DIR and CODEX_HOME are the conversation's
    own (``<account's folders>/lanes/<lane folder>/<cli>``); Claude Code's login
    store (CLAUDE_SECURESTORAGE_CONFIG_DIR) is the account's, shared: the harness's
    own for the default account, the ``--account`` folder for another."""
    home = Path("/p/home")
    default = Account(DEFAULT_ACCOUNT, home / "cli" / "default", owned=True)
    lanes = "/p/home/cli/default/lanes"
    assert default.env("claude", "conv-A-1") == {
        "CLAUDE_CONFIG_DIR": f"{lanes}/conv-A-1/claude",
        "CLAUDE_SECURESTORAGE_CONFIG_DIR": "/p/home/cli/default/login/claude"}
    assert default.env("claude", "conv-B-2")["CLAUDE_CONFIG_DIR"] == f"{lanes}/conv-B-2/claude"
    assert default.env("codex", "conv-A-1") == {"CODEX_HOME": f"{lanes}/conv-A-1/codex"}
    assert default.env("plain", "conv-A-1") == {}
    work = Account("work", Path("/home/me/.claude-work"), own=home / "cli" / "work")
    assert work.env("claude", "conv-A-1") == {
        "CLAUDE_CONFIG_DIR": "/p/home/cli/work/lanes/conv-A-1/claude",
        "CLAUDE_SECURESTORAGE_CONFIG_DIR": "/home/me/.claude-work",
        "PROHOST_ACCOUNT_DIR": "/home/me/.claude-work"}
    assert work.env("codex", "conv-A-1") == {
        "CODEX_HOME": "/p/home/cli/work/lanes/conv-A-1/codex",
        "PROHOST_ACCOUNT_DIR": "/home/me/.claude-work"}
    assert work.env("plain", "conv-A-1") == {"PROHOST_ACCOUNT_DIR": "/home/me/.claude-work"}


def test_names_must_be_unique_and_well_formed() -> None:
    with pytest.raises(AccountError, match="repeated: work"):
        book("work", "personal", "work")
    with pytest.raises(AccountError, match="'a b'"):
        book("a b")
    with pytest.raises(KeyError, match="no account named 'nope'"):
        book("work").started("nope", T0)


def test_a_lane_keeps_its_account_while_it_is_usable() -> None:
    accounts = book("work", "personal")
    accounts.report("work", LimitNotice(state="warning", used_percent=90.0), T0)
    # Stickiness beats headroom: the session lives in the lane's account.
    assert accounts.choose(T0, lane_account="work") == accounts.account("work")
    accounts.report("work", limited(T0 + 600), T0)
    assert accounts.choose(T0, lane_account="work") == accounts.account("personal")
    # An account the run already tried is not chosen again, sticky or not.
    assert accounts.choose(T0, lane_account="personal", exclude={"personal"}) is None


def test_a_new_lane_takes_the_account_with_the_lowest_reported_use() -> None:
    accounts = book("a", "b", "c")
    accounts.report("a", LimitNotice(state="ok", used_percent=41.0), T0)
    accounts.report("b", LimitNotice(state="warning", used_percent=80.0), T0)
    accounts.report("c", LimitNotice(state="ok", used_percent=12.0), T0)
    assert pick(accounts, T0) == "c"
    assert pick(accounts, T0, exclude={"c"}) == "a"


def test_without_figures_the_least_recently_started_goes_first() -> None:
    accounts = book("a", "b", "c")
    assert pick(accounts, T0) == "a"
    accounts.started("a", T0)
    accounts.started("b", T0 + 1)
    assert pick(accounts, T0 + 2) == "c"  # never started
    accounts.started("c", T0 + 2)
    assert pick(accounts, T0 + 3) == "a"


def test_a_limit_lasts_until_its_reset_then_the_account_is_usable_again() -> None:
    accounts = book("work", "personal")
    assert accounts.report("work", limited(T0 + 600), T0) is True
    assert accounts.state("work", T0 + 599) == "limited"
    assert accounts.snapshot(T0)[0] == {"name": "work", "state": "limited",
                                        "resets_at": int(T0 + 600), "used_percent": None}
    assert accounts.state("work", T0 + 600) == "ok"
    assert accounts.choose(T0 + 600, lane_account="work") == accounts.account("work")


def test_a_milder_report_does_not_lift_a_limit_before_its_reset() -> None:
    accounts = book("work")
    accounts.report("work", limited(T0 + 600), T0)
    accounts.report("work", LimitNotice(state="ok", resets_at=T0 + 50, used_percent=64.0), T0 + 1)
    assert accounts.snapshot(T0 + 1) == [{"name": "work", "state": "limited",
                                          "resets_at": int(T0 + 600), "used_percent": 64.0}]


def test_a_limit_without_a_reset_time_is_left_alone_for_an_hour() -> None:
    accounts = book("work")
    accounts.report("work", limited(None), T0)
    assert accounts.earliest_reset(T0) == T0 + UNKNOWN_RESET_S
    assert accounts.state("work", T0 + UNKNOWN_RESET_S - 1) == "limited"
    assert accounts.state("work", T0 + UNKNOWN_RESET_S) != "limited"


def test_a_limit_whose_reset_has_already_passed_is_a_limit_of_unknown_end() -> None:
    # Issue 37 point 9: the CLI repeats a reset time that has passed while the
    # account is still limited: it is tried again after a backoff, doubling.
    accounts = book("work")
    assert accounts.report("work", limited(T0 - 5), T0) is True
    assert accounts.state("work", T0 + 59) == "limited"
    assert accounts.state("work", T0 + 60) != "limited"
    accounts.report("work", limited(T0 - 5), T0 + 60)
    assert accounts.state("work", T0 + 60 + 119) == "limited"
    assert accounts.state("work", T0 + 60 + 120) != "limited"
    accounts.report("work", limited(T0 + 9000), T0 + 200)  # a real reset again
    accounts.report("work", limited(T0 - 5), T0 + 9000)
    assert accounts.state("work", T0 + 9000 + 60) != "limited"  # the backoff started anew


def test_a_warning_is_recorded_not_acted_on() -> None:
    accounts = book("work")
    changed = accounts.report(
        "work", LimitNotice(state="warning", resets_at=T0 + 9000, used_percent=91.0), T0)
    assert changed and accounts.state("work", T0) != "limited"
    assert accounts.snapshot(T0) == [{"name": "work", "state": "warning",
                                      "resets_at": int(T0 + 9000), "used_percent": 91.0}]
    # The same news again is no change (status is re-sent only on a change).
    assert accounts.report(
        "work", LimitNotice(state="warning", resets_at=T0 + 9000, used_percent=91.0), T0) is False
    assert accounts.report("work", None, T0) is False
    accounts.report("work", LimitNotice(state="ok", used_percent=3.0), T0)
    assert accounts.snapshot(T0)[0]["state"] == "ok"
    assert accounts.snapshot(T0)[0]["used_percent"] == 3.0


def test_when_every_account_is_limited_the_earliest_reset_is_the_answer() -> None:
    accounts = book("work", "personal")
    assert not accounts.all_limited(T0) and accounts.earliest_reset(T0) is None
    accounts.report("work", limited(T0 + 900), T0)
    accounts.report("personal", limited(T0 + 300), T0)
    assert accounts.all_limited(T0) and accounts.choose(T0) is None
    assert accounts.earliest_reset(T0) == T0 + 300
    assert accounts.limits(T0) == {"work": T0 + 900, "personal": T0 + 300}
    # The first reset passing frees exactly that account.
    assert not accounts.all_limited(T0 + 300)
    assert accounts.choose(T0 + 300) == accounts.account("personal")
    assert accounts.earliest_reset(T0 + 300) == T0 + 900


def test_a_restart_remembers_limits_still_ahead() -> None:
    accounts = book("work", "personal")
    accounts.restore("work", T0 + 600, T0)
    accounts.restore("personal", T0 - 1, T0)  # already over
    accounts.restore("gone", T0 + 600, T0)  # an account no longer configured
    assert accounts.state("work", T0) == "limited"
    assert accounts.choose(T0, lane_account="work") == accounts.account("personal")
    assert accounts.statistics(T0) == accounts.snapshot(T0)


@given(st.lists(st.tuples(
    st.sampled_from(["a", "b", "c"]),
    st.sampled_from(["ok", "warning", "limited"]),
    st.none() | st.floats(min_value=0, max_value=7200),
    st.none() | st.floats(min_value=0, max_value=100),
    st.floats(min_value=0, max_value=7200),
), max_size=30))
def test_the_chosen_account_is_always_usable_and_none_only_when_all_are_limited(
        reports: list[tuple[str, str, float | None, float | None, float]]) -> None:
    accounts = book("a", "b", "c")
    now = T0
    for name, state, resets_in, used, step in reports:
        now += step
        notice = LimitNotice(state=state,  # type: ignore[arg-type]
                             resets_at=None if resets_in is None else now + resets_in,
                             used_percent=used)
        accounts.report(name, notice, now)
        chosen = accounts.choose(now)
        if chosen is None:
            assert accounts.all_limited(now)
            reset = accounts.earliest_reset(now)
            assert reset is not None and reset > now
        else:
            assert accounts.state(chosen.name, now) != "limited"
            accounts.started(chosen.name, now)
