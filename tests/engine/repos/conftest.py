"""Fixtures of the repos room's tests; helpers are in tests/kits/repos.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kits.repos import isolate_git


@pytest.fixture
def isolated_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """:func:`~tests.kits.repos.isolate_git` for the test (modules that make their
    repositories with tests/kits/repos.py use it for every test)."""
    isolate_git(tmp_path, monkeypatch)
