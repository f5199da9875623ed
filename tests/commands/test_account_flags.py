"""``--account NAME=DIR`` and ``--limit-wait`` parsing (prohost.options)."""

from __future__ import annotations

from pathlib import Path

import pytest

from prohost.options import (
    DEFAULT_LIMIT_WAIT_S,
    OptionError,
    parse_account,
    parse_accounts,
    parse_limit_wait,
)

pytestmark = pytest.mark.protocol("§12")


def test_an_account_is_a_name_and_an_absolute_existing_folder(tmp_path: Path) -> None:
    (tmp_path / "home" / ".claude-work").mkdir(parents=True)
    (tmp_path / "rel").mkdir()
    env = {"HOME": str(tmp_path / "home")}
    assert parse_account("work=~/.claude-work", env, tmp_path) == (
        "work", tmp_path / "home" / ".claude-work")
    assert parse_account("p.2_x-y=rel/", env, tmp_path) == ("p.2_x-y", tmp_path / "rel")


@pytest.mark.parametrize(("raw", "message"), [
    ("work", "--account must be NAME=DIR, e.g. --account work=~/.claude-work (got 'work')"),
    ("=dir", "--account must be NAME=DIR"),
    ("work=", "--account must be NAME=DIR"),
    ("my work=dir", "--account name must be 1 to 32 letters, digits, '_', '.' or '-' "
                    "(got 'my work')"),
    ("x" * 33 + "=dir", "--account name must be 1 to 32"),
    ("wörk=dir", "--account name must be"),
])
def test_a_malformed_account_says_what_is_accepted(tmp_path: Path, raw: str,
                                                   message: str) -> None:
    (tmp_path / "dir").mkdir()
    with pytest.raises(OptionError) as info:
        parse_account(raw, {}, tmp_path)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_an_account_folder_must_exist_and_be_a_directory(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match=r"--account work: .*/missing does not exist; log the"):
        parse_account("work=missing", {}, tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(OptionError, match=r"--account work: .*/file is not a directory"):
        parse_account("work=file", {}, tmp_path)


def test_account_names_are_unique(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert parse_accounts(["work=a", "personal=b"], {}, tmp_path) == (
        ("work", tmp_path / "a"), ("personal", tmp_path / "b"))
    with pytest.raises(OptionError, match="--account work is given twice"):
        parse_accounts(["work=a", "work=b"], {}, tmp_path)
    assert parse_accounts([], {}, tmp_path) == ()


def test_limit_wait_is_a_duration_with_a_fifteen_minute_default() -> None:
    assert parse_limit_wait(None) == DEFAULT_LIMIT_WAIT_S == 900.0
    assert parse_limit_wait("30m") == 1800.0
    assert parse_limit_wait("0") == 0.0
    with pytest.raises(OptionError, match=r"^--limit-wait must be a duration of 0 or more"):
        parse_limit_wait("soon")
    with pytest.raises(OptionError, match="--limit-wait"):
        parse_limit_wait("-5m")
