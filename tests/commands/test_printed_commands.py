"""The commands prohost prints for a person run as printed (issue 40, point 1).

A person who installed prohost in a virtual environment they did not activate has
no ``prohost`` on PATH: the server's banner said ``prohost agent pair …`` and
pairing said ``Start the agent with: prohost agent run``, and neither ran. Here the
banner's pair command, the ``agent run`` that pairing prints and the banner's
``send`` command are each taken from the output and run exactly as printed (split
as a shell splits them), in an environment whose PATH has no prohost: together
they pair a harness, start it (its default ``claude -p``, a fake one on PATH) and
get a reply.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest

from prohost.invocation import command
from tests.kits.clisession import background, clean_env, run
from tests.kits.fake_clis import CLAUDE, install
from tests.kits.serverproc import without_prohost_on_path

#: The console script installed beside this interpreter (``.venv/bin/prohost``).
SCRIPT = Path(sys.executable).parent / "prohost"


@pytest.mark.parametrize("launch", ["script off PATH", "python -m", "script on PATH"])
def test_the_banner_and_pairing_print_commands_that_run_as_printed(
    tmp_path: Path, launch: str,
) -> None:
    if launch != "python -m" and not SCRIPT.is_file():
        pytest.skip(f"no console script {SCRIPT} (scripts/install makes one)")
    install(tmp_path, CLAUDE)  # tmp_path/bin/claude, the default --exec's program
    env = without_prohost_on_path(clean_env(tmp_path / "home"))
    folders = [str(tmp_path / "bin"), env["PATH"]]
    if launch == "script on PATH":
        folders.insert(0, str(SCRIPT.parent))
    env["PATH"] = os.pathsep.join(folders)
    argv = [sys.executable, "-m", "prohost"] if launch == "python -m" else [str(SCRIPT)]
    expected = {"script off PATH": [str(SCRIPT)], "python -m": [sys.executable, "-m", "prohost"],
                "script on PATH": ["prohost"]}[launch]
    # Not the repository: `python -m prohost` must find the installed package.
    cwd = tmp_path

    with background([*argv, "server", "--port", "0"], env, cwd) as server:
        pair = shlex.split(server.wait_line("agent pair --code").strip())
        send = shlex.split(server.wait_line(" send --server").strip())
        assert pair[:len(expected)] == expected and send[:len(expected)] == expected

        paired = run(pair, env, cwd)
        assert paired.returncode == 0, paired
        start = paired.stdout.split("Start the agent with: ", 1)[1].strip()
        assert shlex.split(start) == [*expected, "agent", "run"]

        with background(shlex.split(start), env, cwd) as harness:
            harness.wait_line("connected to")
            sent = run(send, env, cwd)
            assert sent.returncode == 0, sent
            run_id, reply = sent.stdout.splitlines()[:2]
            assert run_id.startswith("run_") and reply  # the fake Claude's answer
            harness.wait_line("✓ run", "finished")


def test_a_printed_command_quotes_what_a_shell_would_split(tmp_path: Path) -> None:
    # Words with spaces stay one word; the program is named as it can be run.
    line = command("send", "--state", str(tmp_path / "my state"), "fix the bug")
    assert shlex.split(line)[-4:] == ["send", "--state", str(tmp_path / "my state"),
                                      "fix the bug"]
