"""Fixtures of the command line's tests; helpers are in tests/kits/ (daemon.py, program.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kits.daemon import fake_program, install_env, pair


@pytest.fixture
def paired(tmp_path: Path) -> dict[str, str]:
    """An installing shell (:func:`~tests.kits.daemon.install_env`) whose home is
    paired, with a ``claude`` on its PATH."""
    env = install_env(tmp_path)
    pair(env)
    fake_program(tmp_path, "claude")
    return env
