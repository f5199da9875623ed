"""The one exception-group flattener that agentproc and link share."""

from __future__ import annotations

from prohost.errors import leaves


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
