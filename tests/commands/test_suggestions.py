"""A misspelled subcommand or flag gets a suggestion (issue 31 point 11): argparse's
``suggest_on_error`` is Python 3.14's; prohost runs on 3.11, so the CLI adds its own."""

from __future__ import annotations

import subprocess
import sys

import pytest

from prohost.cli import main


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["sned", "x"], "invalid choice: 'sned' (choose from 'agent', 'server', 'send', "),
        (["agent", "sttus"], "did you mean 'status'?"),
        (["send", "--wiat", "x"], "unrecognized arguments: --wiat (did you mean --wait?)"),
        (["server", "--prot", "3"], "--prot (did you mean --port?) 3"),
        (["agent", "run", "--conc", "3"], "--conc (did you mean --concurrency?)"),
        (["agent", "run", "--exex=cat"], "--exex=cat (did you mean --exec?)"),
    ],
)
def test_a_near_miss_is_named(argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
                              ) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert said in err
    assert len(err.strip().splitlines()) == 1


def test_nothing_close_gets_no_guess(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["xyzzy"]) == 2
    assert main(["send", "--qqqqqq", "x"]) == 2
    assert "did you mean" not in capsys.readouterr().err


def test_the_installed_command_suggests_too() -> None:
    done = subprocess.run([sys.executable, "-m", "prohost", "sned", "hello"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert done.stderr.rstrip().endswith("did you mean 'send'?")
