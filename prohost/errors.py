"""Turning a failure into the one thing worth showing, shared across modules.

A trio nursery wraps what its tasks raise in a ``BaseExceptionGroup``, nested once
per nursery level. Code that turns such a group back into the one error worth
showing (``agentproc``: the agent's real failure among its tasks' ``Cancelled``;
``link``: why a connection ended) wants the plain exceptions inside, whatever the
nesting: ``leaves``. A child program that failed (git, systemctl, launchctl)
usually says why on the last line it wrote: ``last_line``.

This module depends on nothing in prohost, so any module may use it.
"""

from __future__ import annotations

__all__ = ["LAST_LINE_CHARS", "last_line", "leaves"]

#: A child's last line is cut to this many characters: it goes into a one-line
#: error message, and a program can write a line of any length.
LAST_LINE_CHARS = 300


def leaves(error: BaseException) -> list[BaseException]:
    """The plain (non-group) exceptions inside ``error``, depth first, in order.

    A plain exception is its own only leaf; an empty group has none.
    """
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]


def last_line(data: bytes) -> str:
    """The last non-blank line of a child's output, stripped and cut short; "" if none.

    Undecodable bytes become U+FFFD rather than an error: this text only explains
    another failure.
    """
    lines = [line.strip() for line in data.decode("utf-8", "replace").splitlines()]
    lines = [line for line in lines if line]
    return lines[-1][:LAST_LINE_CHARS] if lines else ""
