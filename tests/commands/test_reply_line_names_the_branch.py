"""The line of a finished run says where the agent's work is.

A real ``prohost server``, a paired ``prohost agent run --repos`` whose agent (a
shell script) commits in its worktree, and ``send --wait``: the harness's log line
for the finished run names the checkout, its branch ``prohost/…`` and the new head,
as ``agent runs --json`` records them; and ``agent logs`` shows that line whether
the harness drew its live panel on a terminal or logged plain lines.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from prohost import cli
from tests.kits.clisession import (
    Background,
    background,
    banner_field,
    clean_env,
    git_repo,
    on_a_terminal,
    run,
)

ROOT = Path(cli.__file__).parents[1]
PROHOST = [sys.executable, "-m", "prohost"]

AGENT = """\
cat > /dev/null
echo work > work.txt
git add work.txt
git -c user.name=agent -c user.email=agent@example.com commit -qm 'the work'
echo committed
"""


Start = Callable[[list[str], dict[str, str], Path], AbstractContextManager[Background]]


@pytest.mark.parametrize(("panel", "start"), [(False, background), (True, on_a_terminal)],
                         ids=["no panel", "live panel on a terminal"])
def test_the_finished_line_names_branch_and_head_of_each_changed_checkout(
    tmp_path: Path, panel: bool, start: Start,
) -> None:
    env = clean_env(tmp_path / "home")
    repo = git_repo(tmp_path / "app")
    other = git_repo(tmp_path / "lib")  # left alone by the agent: not named
    script = tmp_path / "agent.sh"
    script.write_text(AGENT)
    with background([*PROHOST, "server", "--port", "0"], env, ROOT) as server:
        ws, http = banner_field(server, "WebSocket:"), banner_field(server, "HTTP:")
        paired = run([*PROHOST, "agent", "pair", "--code", banner_field(server, "pairing code:"),
                      "--url", ws], env, ROOT)
        assert paired.returncode == 0, paired
        flags = [] if panel else ["--no-panel"]
        with start([*PROHOST, "agent", "run", *flags, "--url", ws, "--exec",
                    f"sh {script}", "--repos", f"{repo},{other}"], env, ROOT) as harness:
            harness.wait_line("connected")
            sent = run([*PROHOST, "send", "--server", http, "--wait", "do the work"], env, ROOT)
            assert sent.returncode == 0, sent
            if not panel:
                said = harness.wait_line("✓ run", "finished")
        # Stopped (a Ctrl-C): the log file has every line by now.
        assert harness.proc.returncode == 0, harness.lines
        runs = json.loads(run([*PROHOST, "agent", "runs", "--json"], env, ROOT).stdout)
        logs = run([*PROHOST, "agent", "logs"], env, ROOT).stdout
    checkouts = {checkout["repo"]: checkout for checkout in runs[0]["checkouts"]}
    branch, head = checkouts["app"]["branch"], checkouts["app"]["head"]
    assert branch.startswith("prohost/") and head
    where = f"1 commit in app on {branch} at {head[:12]}"
    [line] = [line for line in logs.splitlines() if "✓ run" in line]
    assert where in line, logs
    assert "1 file (+1 −0)" in line and "lib on" not in line
    if not panel:
        assert where in said, said
    else:  # drawn on the screen, not also printed there as a log line
        assert not any("✓ run" in line for line in harness.lines), harness.lines
