"""tests/test_agentproc.py again, with the poller that works everywhere.

On Linux run_agent waits on the agent's pipes and its leader's exit through one
epoll instance (prohost/engine/agent/poll.py); elsewhere, or without pidfd, through
a task per descriptor. Every behaviour must be the same with either, so every test
of run_agent runs here a second time with epoll turned off.
"""

from __future__ import annotations

import pytest

from prohost.engine.agent import poll
from tests.test_agentproc import *  # noqa: F403  (the same tests, collected here again)


@pytest.fixture(autouse=True)
def without_epoll(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(poll, "USE_EPOLL", False)
