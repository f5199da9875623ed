"""Fixtures any test may use; helpers are in tests/kits/, and each folder's
conftest.py has the fixtures of its own tests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The common default umask, under which files and folders are world-readable."""
    old = os.umask(0o022)
    yield
    os.umask(old)
