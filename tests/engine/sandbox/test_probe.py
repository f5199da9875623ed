"""What the probe says about this machine, and about one where bubblewrap, or every
way to confine, is missing (tests/kits/no_sandbox.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from prohost.engine.sandbox import Policy, prepare, probe
from prohost.engine.sandbox.landlock import handled_rights
from tests.kits.no_sandbox import without_bubblewrap, without_confinement


def test_a_machine_that_cannot_confine_gives_no_kind_and_an_unconfined_preparation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    without_confinement(monkeypatch)
    support = probe()
    assert support.kind is None
    assert support.reason
    with prepare(Policy(writable=(tmp_path,), hidden=(tmp_path / "h",)), support) as conf:
        assert not conf.confined
        assert (conf.argv_prefix, conf.preexec) == ((), None)


@pytest.mark.skipif(sys.platform != "linux", reason="Landlock is Linux's")
def test_on_linux_the_probe_names_the_landlock_abi(monkeypatch: pytest.MonkeyPatch) -> None:
    support = probe()
    lsm = Path("/sys/kernel/security/lsm")
    if support.kind is None:
        assert "Landlock" in support.reason
        return
    assert f"Landlock ABI {support.abi}" in support.detail
    assert support.abi >= 1
    if lsm.exists():
        assert "landlock" in lsm.read_text()


@pytest.mark.skipif(sys.platform != "linux", reason="bubblewrap is Linux's")
def test_without_bubblewrap_landlock_alone_is_said_to_cover_only_part(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback (no bubblewrap found): a run there is not ``confined``, and
    the probe says which points of §13 do not hold, and why not bubblewrap."""
    without_bubblewrap(monkeypatch)
    support = probe()
    if not support.abi:
        pytest.skip("no Landlock here")
    assert support.kind == "landlock"
    assert not support.complete
    assert any("outlive" in gap for gap in support.gaps)
    assert any("modes" in gap for gap in support.gaps)
    assert "bubblewrap" in support.reason


def test_the_handled_rights_follow_the_abi() -> None:
    assert handled_rights(1) == (1 << 13) - 1
    assert handled_rights(2) == handled_rights(1) | 1 << 13  # REFER
    assert handled_rights(3) == handled_rights(4) == handled_rights(2) | 1 << 14  # TRUNCATE
    assert handled_rights(5) == handled_rights(7) == handled_rights(3) | 1 << 15  # IOCTL_DEV


def test_an_unconfined_preparation_still_spawns(monkeypatch: pytest.MonkeyPatch) -> None:
    without_confinement(monkeypatch)
    with prepare(Policy(), probe()) as conf:
        done = subprocess.run(["sh", "-c", "echo ran"], preexec_fn=conf.preexec,
                              capture_output=True, text=True, check=True)
    assert done.stdout == "ran\n"
