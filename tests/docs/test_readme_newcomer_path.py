"""The README's "Your own machine, step by step" works as written (issue 31, point 8).

The commands are read from that section of the README itself, so the test fails
when the README drifts from what the program does: server, pair, a run with
``--exec cat`` and ``--repos``, send, status, runs, logs, cancel, stop. Each runs as a real
process from the clone's top folder, as a person would type it; only what the
README says to fill in is filled in: the port (0, so tests never collide; the
README's 8765 becomes the one the server took), the pairing code the server
printed, ``~/code/app`` (a fresh git checkout) and the first characters of a run id.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from subprocess import CompletedProcess

from tests.kits.clisession import background, banner_field, clean_env, git_repo, run
from tests.kits.paths import ROOT

SECTION = "## Your own machine, step by step"
PROHOST = ".venv/bin/prohost"
README_PORT = "8765"
README_CODE = "ABCD-1234"
README_REPO = "~/code/app"
#: The first characters of a run id `agent cancel` is shown with.
README_PREFIX = "673c"


def section_commands() -> list[str]:
    """Every ``.venv/bin/prohost`` line of the section's code blocks, in order."""
    text = (ROOT / "README.md").read_text()
    assert SECTION in text, f"the README has no {SECTION!r} section"
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", body, flags=re.DOTALL)
    return [line.strip() for block in blocks for line in block.splitlines()
            if line.strip().startswith(PROHOST + " ")]


def the(commands: list[str], *words: str) -> str:
    """The one command whose words start with ``words`` after the program."""
    found = [command for command in commands
             if shlex.split(command)[1:1 + len(words)] == list(words)]
    assert len(found) == 1, f"the section should show one `prohost {' '.join(words)}`: {found}"
    return found[0]


def argv(command: str, **fill: str) -> list[str]:
    """``command`` as the README writes it, with its placeholders filled in."""
    for placeholder, value in fill.items():
        command = command.replace(placeholder, value)
    words = shlex.split(command)
    program = ROOT / PROHOST
    # The clone's own entry point, as scripts/install made it; the same program by
    # this interpreter where the suite runs without one (the words after are the README's).
    head = [str(program)] if program.exists() else [sys.executable, "-m", "prohost"]
    return [*head, *words[1:]]


def status_once_written(command: list[str], env: dict[str, str]) -> CompletedProcess[str]:
    """``agent status`` once the harness's picture shows its connection: the file is
    rewritten at most once a second, and this test types faster than a person. Each
    call paces the next (no sleep); ten seconds at most (it is rewritten every 5 s)."""
    deadline = time.monotonic() + 10
    while True:
        status = run(command, env, ROOT)
        if status.returncode != 4 or time.monotonic() > deadline:
            return status


def test_the_newcomer_path_runs_as_the_readme_says(tmp_path: Path) -> None:
    commands = section_commands()
    repo = git_repo(tmp_path / "app")
    env = clean_env(tmp_path / "home")
    server_line = the(commands, "server")
    assert f"--port {README_PORT}" in server_line
    with background(argv(server_line, **{f"--port {README_PORT}": "--port 0"}),
                    env, ROOT) as server:
        address = banner_field(server, "HTTP:").removeprefix("http://")
        code = banner_field(server, "pairing code:")
        fill = {f"127.0.0.1:{README_PORT}": address, README_CODE: code,
                README_REPO: str(repo)}

        paired = run(argv(the(commands, "agent", "pair"), **fill), env, ROOT)
        assert paired.returncode == 0, paired

        run_line = next(command for command in commands
                        if shlex.split(command)[1:3] == ["agent", "run"]
                        and "--exec cat" in command)
        assert "--repos" in run_line
        with background(argv(run_line, **fill), env, ROOT) as harness:
            harness.wait_line("connected to")

            sent = run(argv(the(commands, "send"), **fill), env, ROOT)
            assert sent.returncode == 0, sent
            assert "hello" in sent.stdout  # cat replies with the prompt it was given

            status = status_once_written(argv(the(commands, "agent", "status"), **fill), env)
            assert status.returncode == 0, status
            assert "connected" in status.stdout
            runs = run(argv(the(commands, "agent", "runs"), **fill), env, ROOT)
            assert runs.returncode == 0 and runs.stdout.startswith("✓"), runs
            # The run's own branch in its worktree, named by its run id (issue 40 point
            # 5); `cat` changed nothing, so neither is left behind.
            run_id = runs.stdout.split()[3]
            assert f" prohost/{run_id}@" in runs.stdout, runs.stdout
            assert not (tmp_path / "home" / "worktrees" / run_id).exists()
            branches = subprocess.run(["git", "-C", str(repo), "branch", "--list", "prohost/*"],
                                      capture_output=True, text=True, check=True)
            assert branches.stdout == ""
            logs = run(argv(the(commands, "agent", "logs"), **fill), env, ROOT)
            assert logs.returncode == 0 and "finished" in logs.stdout, logs

            # The run's id as `agent runs` listed it, typed short as the README does.
            short = run_id.removeprefix("run_")[:len(README_PREFIX)]
            cancel = the(commands, "agent", "cancel")
            assert cancel.split()[-1] == README_PREFIX
            cancelled = run(argv(cancel, **{README_PREFIX: short}), env, ROOT)
            assert cancelled.returncode == 1, cancelled  # `cat` has long finished
            assert f"run {run_id} has already ended: it finished" in cancelled.stderr

            stopped = run(argv(the(commands, "agent", "stop"), **fill), env, ROOT)
            assert stopped.returncode == 0, stopped
            assert harness.proc.wait(timeout=60) == 0
