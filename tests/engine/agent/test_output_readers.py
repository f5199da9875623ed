"""The bounded output readers, fed chunks cut anywhere: what the pipes may hand over."""

from __future__ import annotations

import itertools
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prohost.engine.agent.output import STDERR_LINE_CHARS, LastLine, LineSplitter

pytestmark = pytest.mark.protocol("§5")


def cut(data: bytes, points: list[int]) -> list[bytes]:
    """``data`` in chunks, cut at ``points`` (any order, repeats allowed)."""
    edges = sorted({0, len(data), *(p % (len(data) + 1) for p in points)})
    return [data[a:b] for a, b in itertools.pairwise(edges)]


lines_st = st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=12)


@given(lines=lines_st, end_with_newline=st.booleans(), limit=st.integers(1, 30),
       points=st.lists(st.integers(0, 10_000), max_size=20))
def test_lines_come_out_whole_whatever_the_chunks_and_long_ones_are_counted(
    lines: list[bytes], end_with_newline: bool, limit: int, points: list[int],
) -> None:
    data = b"\n".join(lines) + (b"\n" if end_with_newline and lines else b"")
    seen: list[bytes] = []
    splitter = LineSplitter(seen.append, limit)
    for chunk in cut(data, points):
        splitter.feed(chunk)
    splitter.close()

    parts = data.split(b"\n")
    complete, tail = parts[:-1], parts[-1]
    every = complete + ([tail] if tail else [])
    assert seen == [line for line in every if len(line) <= limit]
    assert splitter.dropped == sum(len(line) > limit for line in every)


def test_a_line_over_the_limit_is_never_held_and_the_next_one_is(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[bytes] = []
    splitter = LineSplitter(seen.append, 8)
    with caplog.at_level(logging.WARNING, logger="prohost.agentproc"):
        for chunk in (b"ok\nthis line is", b" far too long", b" to keep\nnext", b"\n"):
            splitter.feed(chunk)
        splitter.close()
    assert seen == [b"ok", b"next"]
    assert splitter.dropped == 1
    assert "over 8 bytes" in caplog.text


@given(lines=st.lists(st.sampled_from([b"", b"  ", b"boom", b"bad config", b"\xff\xfe"]),
                      max_size=10),
       points=st.lists(st.integers(0, 10_000), max_size=10))
def test_the_last_non_empty_stderr_line_whatever_the_chunks(
    lines: list[bytes], points: list[int],
) -> None:
    data = b"\n".join(lines)
    last = LastLine()
    for chunk in cut(data, points):
        last.feed(chunk)
    last.close()
    said = [line for line in lines if line.strip()]
    expected = said[-1].decode("utf-8", errors="replace").strip() if said else ""
    assert last.text == expected


def test_the_last_stderr_line_keeps_only_its_start() -> None:
    last = LastLine()
    # One line far over the byte bound, fed in pieces, then blank lines after it.
    for _ in range(10):
        last.feed(b"E" * 1000)
    last.feed(b"\n\n   \n")
    last.close()
    assert last.text == "E" * STDERR_LINE_CHARS
