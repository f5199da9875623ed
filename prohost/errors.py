"""Exception-group helpers shared by the process and connection code.

A trio nursery wraps what its tasks raise in a ``BaseExceptionGroup``, nested once
per nursery level. Code that turns such a group back into the one error worth
showing (``agentproc``: the agent's real failure among its tasks' ``Cancelled``;
``link``: why a connection ended) wants the plain exceptions inside, whatever the
nesting. This module depends on nothing in prohost, so any module may use it.
"""

from __future__ import annotations

__all__ = ["leaves"]


def leaves(error: BaseException) -> list[BaseException]:
    """The plain (non-group) exceptions inside ``error``, depth first, in order.

    A plain exception is its own only leaf; an empty group has none.
    """
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]
