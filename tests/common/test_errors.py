"""The one exception-group flattener that agentproc and link share."""

from __future__ import annotations

from prohost.errors import LAST_LINE_CHARS, last_line, leaves


def test_leaves_flattens_nested_groups_depth_first_in_order() -> None:
    a, b, c = ValueError("a"), KeyError("b"), OSError("c")
    inner = BaseExceptionGroup("inner", [b, KeyboardInterrupt()])
    group = BaseExceptionGroup("outer", [a, inner, c])
    found = leaves(group)
    assert found[:2] == [a, b]
    assert isinstance(found[2], KeyboardInterrupt)
    assert found[3] is c
    assert len(found) == 4


def test_a_plain_exception_is_its_own_leaf() -> None:
    error = RuntimeError("plain")
    assert leaves(error) == [error]


def test_last_line_is_the_last_non_blank_line_stripped() -> None:
    data = b"Cloning...\n  fatal: not a git repository  \n\n \t\n"
    assert last_line(data) == "fatal: not a git repository"


def test_last_line_of_nothing_is_empty() -> None:
    assert last_line(b"") == ""
    assert last_line(b"\n  \n") == ""


def test_last_line_is_cut_short_and_survives_bad_bytes() -> None:
    line = last_line(b"ok\n\xff" + b"x" * 10_000 + b"\n")
    assert line.startswith("\ufffdxxx")
    assert len(line) == LAST_LINE_CHARS
