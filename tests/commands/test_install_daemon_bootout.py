"""A launchd reinstall says what it waits for before it waits (issue 20, point 14).

``launchctl bootout`` returns only once the old harness has drained: minutes, up to
the service's stop timeout. The installer must say so before that wait, not after.
A fake launchctl (a real program on PATH) records its calls; the output printed by
the moment bootout is called is taken then.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from prohost.commands import daemon
from prohost.commands.daemon import install_daemon_command
from tests.kits.daemon import calls, fake_manager, spec_for


def test_a_launchd_reinstall_says_it_waits_for_the_drain_before_bootout(
    tmp_path: Path, paired: dict[str, str], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    record = fake_manager(tmp_path, "launchctl")
    options, spec = spec_for(paired, tmp_path, "--timeout", "10m")
    assert install_daemon_command(options, print_only=False, env=paired, platform="darwin") == 0
    capsys.readouterr()

    printed_before_bootout: list[str] = []
    real_run = daemon._run

    def run(tool: str, args: Sequence[str], env: Mapping[str, str], timeout: float) -> daemon._Ran:
        if list(args[:1]) == ["bootout"]:
            printed_before_bootout.append(capsys.readouterr().out)
        return real_run(tool, args, env, timeout)

    monkeypatch.setattr(daemon, "_run", run)
    assert install_daemon_command(options, print_only=False, env=paired, platform="darwin") == 0
    assert calls(record)[2] == f"bootout gui/{os.getuid()}/{spec.label}"
    (before,) = printed_before_bootout
    minutes = -(-spec.stop_timeout_s // 60)
    assert "stopping the running harness" in before
    assert f"up to {minutes} min" in before
