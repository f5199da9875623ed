"""Fixtures of the engine's tests; helpers are in tests/kits/."""

from __future__ import annotations

import pytest

from prohost.engine.agent.process import ProcessGroups


@pytest.fixture
def groups() -> ProcessGroups:
    """The process groups a run's agents join, with a short TERM→KILL grace (the
    stubborn agents and grandchildren make every stop use all of it)."""
    groups = ProcessGroups()
    groups.grace_s = 0.2
    return groups
