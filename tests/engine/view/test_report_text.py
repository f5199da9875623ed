"""The few words people read about a report's ``changes`` and ``usage`` (§7): never
an error, whatever JSON a server or a ledger hands over, and never a control
character from a file name on the terminal."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from prohost.engine.view.reporttext import changes_lines, file_lines, files_line, usage_line

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(["repo", "files", "path", "change", "added", "removed",
                                       "committed", "from", "more_files", "commits",
                                       "branch", "error", "x"]) | st.text(max_size=5),
                      inner, max_size=6),
    max_leaves=20)


@given(JSON, JSON)
def test_any_json_is_described_without_raising_or_control_characters(
    changes: Any, usage: Any,
) -> None:
    lines = changes_lines(changes)
    if isinstance(changes, list):
        for entry in changes:
            if isinstance(entry, dict):
                lines += [files_line(entry), *file_lines(entry)]
    said = usage_line(usage)
    for line in [*lines, *([said] if said else [])]:
        assert all(ch.isprintable() for ch in line), line


def test_a_file_name_cannot_write_to_the_terminal() -> None:
    entry = {"repo": "app", "files": [{"path": "a\nb\x1b[2J", "change": "added",
                                       "added": 1, "removed": 0, "committed": True}]}
    assert file_lines(entry) == ["A a\\nb\\x1b[2J +1 −0"]


def test_binary_renamed_and_many_files() -> None:
    entry = {"repo": "app", "commits": 0, "more_files": 5, "files": [
        {"path": "img.png", "change": "modified", "added": None, "removed": None,
         "committed": True},
        {"path": "new.py", "from": "old.py", "change": "renamed", "added": 0, "removed": 0,
         "committed": True}]}
    assert files_line(entry) == "app: 7 files (+0 −0 in the 2 listed)"
    assert file_lines(entry, most=1) == ["M img.png (binary)", "… and 6 more files"]
    assert file_lines(entry)[1] == "R new.py ← old.py +0 −0"
    assert files_line({"repo": "app", "files": [], "commits": 0}) == "app: nothing changed"


def test_usage_says_only_what_is_known() -> None:
    assert usage_line({"output_tokens": 5}) == "0 in · 5 out tokens"
    assert usage_line({"cost_usd": 12.5, "turns": 1}) == "$12.50 · 1 turn"
    assert usage_line({}) is None and usage_line(None) is None
