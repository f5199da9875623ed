"""The line of a finished run says where the agent's work is (issue 31, point 5).

A real ``prohost server``, a paired ``prohost agent run --repos`` whose agent (a
shell script) commits in its worktree, and ``send --wait``: the harness's log line
for the finished run names the checkout, its branch ``prohost/…`` and the new head,
as ``agent runs --json`` records them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from prohost import cli
from tests.kits.clisession import background, banner_field, clean_env, git_repo, run

ROOT = Path(cli.__file__).parents[1]
PROHOST = [sys.executable, "-m", "prohost"]

AGENT = """\
cat > /dev/null
echo work > work.txt
git add work.txt
git -c user.name=agent -c user.email=agent@example.com commit -qm 'the work'
echo committed
"""


def test_the_finished_line_names_branch_and_head_of_each_changed_checkout(
    tmp_path: Path,
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
        with background([*PROHOST, "agent", "run", "--no-panel", "--url", ws, "--exec",
                         f"sh {script}", "--repos", f"{repo},{other}"], env, ROOT) as harness:
            harness.wait_line("connected to")
            sent = run([*PROHOST, "send", "--server", http, "--wait", "do the work"], env, ROOT)
            assert sent.returncode == 0, sent
            line = harness.wait_line("✓ run", "finished")
        runs = json.loads(run([*PROHOST, "agent", "runs", "--json"], env, ROOT).stdout)
    checkouts = {checkout["repo"]: checkout for checkout in runs[0]["checkouts"]}
    branch, head = checkouts["app"]["branch"], checkouts["app"]["head"]
    assert branch.startswith("prohost/") and head
    assert f"1 commit in app on {branch} at {head[:12]}" in line, line
    assert "lib on" not in line
