"""`prohost demo` is the newcomer's first command: it must work, and clean up (or,
with ``--keep``, say where its work is)."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

from prohost.engine.agent.brains.claude import ClaudeBrain
from prohost.execline import version_command
from tests.kits.panel import assert_fits


def demo_dirs(tmp_path: Path) -> set[str]:
    """The demo folders in the test's own temporary folder (the demo's $TMPDIR)."""
    return {name for name in os.listdir(tmp_path / "tmp") if name.startswith("prohost-demo-")}


def run_demo(tmp_path: Path, *args: str, columns: int = 200) -> tuple[str, str]:
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "COLUMNS": str(columns), "PROHOST_HOME": str(tmp_path / "untouched"),
           "TMPDIR": str(tmp_path / "tmp")}
    result = subprocess.run([sys.executable, "-m", "prohost", "demo", *args],
                            capture_output=True, env=env, check=False, timeout=120,
                            stdin=subprocess.DEVNULL)
    err = result.stderr.decode()
    assert result.returncode == 0, err
    return result.stdout.decode(), err


def test_demo_runs_a_dozen_runs_and_leaves_nothing_behind(tmp_path: Path) -> None:
    out, err = run_demo(tmp_path)
    assert "prohost demo results" in out
    assert "12 of 12 runs completed" in out
    assert out.count("✓ ") == 12
    # What each run did (§7): the stand-in notes each request in its conversation's
    # worktree of the demo repository, commits it and leaves a scratch file, and
    # reports pretend usage, marked as such.
    assert out.count("2 files (+2 −0), 1 commit") == 12
    assert out.count(" tok $0.") == 12
    assert "pretend figures" in out
    # Progress is shown while it works (stdout is not a terminal here, so the
    # panel degrades to one log line per change).
    assert "prohost.panel" in err
    assert "started" in err and "finished in" in err
    # The version is the stand-in's own, not its interpreter's (issue 31, point 10).
    assert "agent CLI: claude 0.1 (prohost demo stand-in)" in err
    assert "Python 3" not in err
    assert demo_dirs(tmp_path) == set()
    assert not (tmp_path / "untouched").exists()
    assert demo_agents_in(tmp_path) == []


def demo_agents_in(tmp_path: Path) -> list[int]:
    """Demo agents still alive that this test's demo started (they ran in its folder;
    other tests' demos may run at the same time)."""
    found = subprocess.run(["pgrep", "-f", "prohost.commands.demo_agent"],
                           capture_output=True, text=True, check=False).stdout.split()
    ours = []
    for pid in map(int, found):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue  # gone since, or not ours to read
        if cwd.startswith(str(tmp_path)):
            ours.append(pid)
    return ours


def test_demo_results_are_readable_at_80_columns(tmp_path: Path) -> None:
    out, _ = run_demo(tmp_path, columns=80)
    assert_fits(out, 80)
    results = out[out.index("prohost demo results"):].splitlines()
    # Each run is one line of facts and one of its reply, never a cell wrapped one
    # word per line.
    replies = [line for line in results if line.startswith("  Pretend answer to: ")]
    assert len(replies) == 12
    assert "  Pretend answer to: Summarise the open review comments" in replies
    facts = [line for line in results if line.startswith("✓ ")]
    assert len(facts) == 12
    assert all("2 files (+2 −0), 1 commit" in line and " tok $0." in line for line in facts)


def test_demo_keep_leaves_the_repository_and_names_its_branches(tmp_path: Path) -> None:
    out, _ = run_demo(tmp_path, "--keep")
    kept = re.search(r"^kept in (\S+):$", out, re.MULTILINE)
    assert kept is not None, out
    folder = Path(kept[1])
    try:
        repo = folder / "demo-repo"
        assert f"  repository {repo}, one branch per conversation:" in out
        branches = subprocess.run(
            ["git", "-C", str(repo), "branch", "--list", "--format=%(refname:short)",
             "prohost/*"], capture_output=True, text=True, check=True).stdout.split()
        # One branch per conversation, each named in the output with a way to see it.
        assert len(branches) == 4
        assert f"  see one:   git -C {repo} log --oneline main..{branches[0]}" in out
        for branch in branches:
            assert f"\n    {branch}\n" in out
            log = subprocess.run(["git", "-C", str(repo), "log", "--oneline",
                                  f"main..{branch}"], capture_output=True, text=True,
                                 check=True).stdout.splitlines()
            assert len(log) == 3  # three turns, one commit each
        home = folder / "home"
        runs_line = rf"  its runs:  PROHOST_HOME={re.escape(str(home))} .*prohost agent runs\n"
        assert re.search(runs_line, out)
        listed = subprocess.run([sys.executable, "-m", "prohost", "agent", "runs", "--json"],
                                env={**os.environ, "PROHOST_HOME": str(home)},
                                capture_output=True, text=True, check=True)
        runs = json.loads(listed.stdout)
        assert len(runs) == 12
        # Each run says where it left its checkout: its conversation's branch and
        # the commit it made there (issue 31, point 6).
        for run in runs:
            [checkout] = run["checkouts"]
            assert checkout["repo"] == "demo-repo"
            assert checkout["branch"] in branches
            assert re.fullmatch(r"[0-9a-f]{40}", checkout["head"])
        newest = runs[0]["checkouts"][0]
        tip = subprocess.run(["git", "-C", str(repo), "rev-parse", newest["branch"]],
                             capture_output=True, text=True, check=True).stdout.strip()
        assert newest["head"] == tip
        text = subprocess.run([sys.executable, "-m", "prohost", "agent", "runs"],
                              env={**os.environ, "PROHOST_HOME": str(home)},
                              capture_output=True, text=True, check=True).stdout
        assert f"{newest['branch']}@{tip[:10]}" in text.splitlines()[0]
        assert f"  remove it: rm -rf {folder}" in out
        assert folder.parent == tmp_path / "tmp"
    finally:
        subprocess.run(["rm", "-rf", str(folder)], check=True)


def test_the_demo_agent_reports_tool_calls_the_panel_shows(tmp_path: Path) -> None:
    """Its stream-json, read by the claude brain as the harness reads it: each step is
    a tool call, so the activity column is never empty while it works."""
    brain = ClaudeBrain(f"{sys.executable} -m prohost.commands.demo_agent")
    turn = brain.new_turn()
    output = subprocess.run(
        [sys.executable, "-m", "prohost.commands.demo_agent"], input=b"The request:\n> hi\n",
        capture_output=True, check=True, cwd=tmp_path,
        env={**os.environ, "PROHOST_RUN_REPOS": ""}).stdout
    seen = []
    for line in output.splitlines():
        events = turn.feed(line)
        seen.extend(f"{event.name}:{event.state}" for event in events)
        if turn.activity not in (None, "thinking"):
            seen.append(f"activity {turn.activity}")
    assert "activity Read: README.md" in seen
    assert "activity Edit: notes.md" in seen
    assert seen.count("Bash:done") == 1 and seen.count("Read:calling") == 1


def test_the_version_probe_asks_the_program_actually_run() -> None:
    python = sys.executable
    # An interpreter followed by a script, module or package: theirs, never its own.
    assert version_command(f"{python} -m prohost.commands.demo_agent") == (
        f"{python} -m prohost.commands.demo_agent --version")
    assert version_command("python3 -u agent.py --flag") == "python3 -u agent.py --version"
    assert version_command("python3.11 -W ignore agent.py") == (
        "python3.11 -W ignore agent.py --version")
    assert version_command("node ./agent.js -p") == "node ./agent.js --version"
    assert version_command("npx -y @anthropic-ai/claude-code -p") == (
        "npx -y @anthropic-ai/claude-code --version")
    assert version_command("FOO=1 env nice -n 3 node a.js") == (
        "FOO=1 env nice -n 3 node a.js --version")
    # Code on the line, or nothing to run: no version rather than the interpreter's.
    assert version_command("python -c 'print(1)'") is None
    assert version_command("node") is None
    assert version_command("bash -c cat") is None
    # A shell's clustered -c: code too (asking it would start the agent itself).
    assert version_command("bash -lc 'claude -p'") is None
    # A program that is not an interpreter is asked itself, as before.
    assert version_command("claude -p") == "claude --version"


def test_the_demo_s_last_frame_on_a_terminal_says_it_drained(tmp_path: Path) -> None:
    """On a terminal the demo draws the live panel; its last frame is the finished
    harness's, not "draining … no heartbeat yet" (issue 31, point 9)."""
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "COLUMNS": "100", "LINES": "50", "TERM": "xterm",
           "PROHOST_HOME": str(tmp_path / "untouched"), "TMPDIR": str(tmp_path / "tmp")}
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "prohost", "demo"], env=env,
                                stdin=follower, stdout=follower, stderr=follower)
        os.close(follower)
        follower = -1
        screen = bytearray()
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: every writer of the terminal is gone
                break
            if not chunk:
                break
            screen += chunk
        assert proc.wait(timeout=120) == 0
    finally:
        if follower >= 0:
            os.close(follower)
        os.close(leader)
    text = screen.decode("utf-8", "replace")
    results = text.rindex("prohost demo results")
    # The last frame drawn before the results is the finished one.
    assert "✓ drained" in text[:results]
    last = text[text.rindex("✓ drained", 0, results):results]
    assert "exited: every run it took has finished" in last
    assert "no heartbeat yet" not in last and "draining" not in last and "Ctrl-C" not in last
    # While it ran, the activity column showed the stand-in's tool calls.
    assert re.search(r"(Read: README\.md|Grep: TODO|Edit: notes\.md|Bash: git commit)", text)
