"""A newcomer's first hour past the README's step-by-step, as real processes typed
from the clone's top folder: a run cancelled while its agent works (``prohost runs
cancel``, the reference server's cancel), the server restarted while the harness
runs (the harness reconnects by itself, and the next run completes), and the
branches left behind in the person's checkout: one per conversation, named as the
README says (``prohost/conv-…``).

The server and harness are started as the README's step-by-step starts them (its
commands are tested as written in test_readme_newcomer_path.py); the agent is a
small shell script that echoes its prompt as ``cat`` does, but takes its time when
asked to, so that there is a run in flight to cancel.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.kits.clisession import background, banner_field, clean_env, git_repo, run
from tests.kits.paths import ROOT

PROGRAM = ROOT / ".venv" / "bin" / "prohost"
PROHOST = [str(PROGRAM)] if PROGRAM.exists() else [sys.executable, "-m", "prohost"]

#: ``cat``, but a prompt that asks to take its time keeps the agent busy until stopped.
AGENT = """\
prompt=$(cat)
case "$prompt" in *"take your time"*) sleep 600 ;; esac
printf '%s\\n' "$prompt"
"""


def send(http: str, env: dict[str, str], conversation: str, text: str,
         *, wait: bool = True) -> subprocess.CompletedProcess[str]:
    return run([*PROHOST, "send", "--server", http, "--conversation", conversation,
                *(["--wait"] if wait else []), text], env, ROOT)


def assert_cancelled(http: str, env: dict[str, str], run_id: str) -> None:
    """The server has the run's report: cancelled by the person, and not retried."""
    shown = run([*PROHOST, "runs", "show", run_id, "--json", "--server", http], env, ROOT)
    assert shown.returncode == 0, shown
    record = json.loads(shown.stdout)
    assert record["error"].startswith("cancelled"), record
    assert record["retried_as"] is None, record


def test_a_cancel_a_server_restart_and_the_branches_left_behind(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "app")
    env = clean_env(tmp_path / "home")
    agent = tmp_path / "agent.sh"
    agent.write_text(AGENT)
    with background([*PROHOST, "server", "--port", "0"], env, ROOT) as server:
        http = banner_field(server, "HTTP:")
        ws = banner_field(server, "WebSocket:")
        port = http.rsplit(":", 1)[1]
        paired = run([*PROHOST, "agent", "pair", "--code",
                      banner_field(server, "pairing code:"), "--url", ws], env, ROOT)
        assert paired.returncode == 0, paired
        with background([*PROHOST, "agent", "run", "--exec", f"sh {agent}",
                         "--repos", str(repo)], env, ROOT) as harness:
            harness.wait_line("connected to")
            first = send(http, env, "alpha", "hello")
            assert first.returncode == 0 and "hello" in first.stdout, first

            # A cancel from this machine, the run named by its first characters: the
            # run's agent is working; it is stopped and reported cancelled, not tried
            # again.
            sent = send(http, env, "beta", "take your time", wait=False)
            assert sent.returncode == 0, sent
            run_id = sent.stdout.strip()
            harness.wait_line(run_id, "running")
            cancelled = run([*PROHOST, "agent", "cancel", run_id[:10]], env, ROOT)
            assert cancelled.returncode == 0, cancelled
            harness.wait_line(f"✗ run {run_id}")
            assert_cancelled(http, env, run_id)

            # The server restarts on its port (its pairings are kept in its state):
            # the harness reconnects without being told, and the next turn completes.
            server.stop()
            seen = len(harness.lines)
            with background([*PROHOST, "server", "--port", port], env, ROOT) as again:
                assert banner_field(again, "HTTP:") == http
                harness.wait_line("connected to", since=seen)
                later = send(http, env, "alpha", "hello again")
                assert later.returncode == 0 and "hello again" in later.stdout, later
                # The restarted server has forgotten its runs; the harness's ledger
                # still says the run was cancelled, and nothing ran it again.
                runs = json.loads(run([*PROHOST, "agent", "runs", "--json"], env, ROOT).stdout)
                [row] = [row for row in runs if row["run_id"] == run_id]
                assert row["error"].startswith("cancelled"), row
                assert len([line for line in harness.lines
                            if run_id in line and "started" in line]) == 1, harness.lines
                stopped = run([*PROHOST, "agent", "stop"], env, ROOT)
                assert stopped.returncode == 0, stopped
                assert harness.proc.wait(timeout=60) == 0

    # The branches left behind: one per conversation, as the README says.
    listed = subprocess.run(["git", "-C", str(repo), "branch", "--list", "prohost/*",
                             "--format=%(refname:short)"], capture_output=True, text=True,
                            check=True).stdout.split()
    assert sorted(listed) == ["prohost/alpha", "prohost/beta"], listed
    readme = (ROOT / "README.md").read_text()
    assert "`prohost/<conversation>`" in readme
