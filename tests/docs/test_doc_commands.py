"""Every shell command in README.md and docs/*.md runs as written when copied from
the page into a terminal.

Each ``sh`` block (a ``bash``, ``shell`` or ``console`` one too) is read from the
page itself and:

- parses (``bash -n``), and no command continues (a trailing ``\\``) into a line
  that holds a comment, or carries a comment on a line it continues from: bash
  ends the command at the comment, and the lines after it run as commands of
  their own;
- is run where that is safe, as the person would type it, from the clone's top
  folder, with ``HOME`` a fresh folder holding what the page says is there
  (``~/code/app`` a git checkout, ``~/.ssh``, ``~/.claude/settings.json``, the
  ``--account`` folders) and the agent CLIs the lines name as stand-ins on PATH:
  each ``prohost agent run`` line through ``prohost agent install-daemon --print``
  with the same flags (every flag checked as ``agent run`` checks it, nothing
  installed, nothing started), and the blocks of plain file commands in bash;
- or is named in :data:`NOT_RUN` with the reason, and the test that runs it where
  there is one. A new block that is none of these fails the test until it is
  classified.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kits.clisession import clean_env, git_repo
from tests.kits.paths import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^([ \t]*)```(?:sh|bash|shell|console)[ \t]*\n(.*?)^\1```",
                   re.MULTILINE | re.DOTALL)
PROHOST = ".venv/bin/prohost"

#: Lines not run here, by how they start, and why (where another test runs them).
NOT_RUN = {
    "scripts/install && .venv/bin/prohost demo": "the demo: tests/commands/test_demo.py",
    "scripts/install test && scripts/test": "the whole suite: this very run",
    f"{PROHOST} server": "the README's step-by-step: tests/docs/test_readme_newcomer_path.py",
    f"{PROHOST} send": "the README's step-by-step",
    f"{PROHOST} agent status": "the README's step-by-step",
    f"{PROHOST} agent runs": "the README's step-by-step",
    f"{PROHOST} agent logs": "the README's step-by-step",
    f"{PROHOST} agent stop": "the README's step-by-step",
    f"{PROHOST} agent cancel": "the README's step-by-step",
    f"{PROHOST} agent pair --code ABCD-1234 --url ws://127.0.0.1:8765":
        "the README's step-by-step",
    f"{PROHOST} agent pair --code ABCD-1234 --url wss://api.prohost.ai":
        "pairs with the Prohost service over the network",
    ".venv/bin/python scripts/soak.py": "the soak: tests/scripts, and `scripts/test -m slow`",
    "CLAUDE_CONFIG_DIR=~/.claude-work claude": "an interactive login (Claude Code's /login)",
    "CLAUDE_CONFIG_DIR=~/.claude-personal claude": "an interactive login",
    "CODEX_HOME=~/.codex-work codex login": "an interactive login (Codex's)",
}
#: Commands of blocks run whole in bash: plain file commands.
FILE_COMMANDS = ("mkdir ", "cp ")
#: Placeholders of the pages, and what stands for them here.
ABSOLUTE_PLACES = {"/var/log/myapp": "myapp-logs"}
#: Agent CLIs the pages name in --exec lines: stand-ins on PATH answer --version.
STAND_INS = ("claude", "codex", "gemini", "my-agent")


def blocks() -> list[tuple[str, int, str]]:
    """Every shell block: its page, its first line's number, its text (dedented)."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in BLOCK.finditer(text):
            indent = len(match[1])
            body = "".join(line[indent:] if line[:indent].isspace() else line
                           for line in match[2].splitlines(keepends=True))
            found.append((page.name, text.count("\n", 0, match.start()) + 2, body))
    return found


def commands(body: str) -> list[str]:
    """The block's commands, continued lines joined, comments and blank lines left out."""
    joined = re.sub(r"\\\n", " ", body)
    words = [shlex.split(line, comments=True) for line in joined.splitlines()]
    return [" ".join(word if word in ("&&", "||", ";", "|") or _PLAIN.fullmatch(word)
                     else shlex.quote(word) for word in line)
            for line in words if line]


#: A word that needs no quotes to reach bash as it is (``~`` and ``$`` left to it).
_PLAIN = re.compile(r"[\w@%+=:,./~$-]+")


def continued_into_comments(body: str) -> list[str]:
    """Lines of ``body`` where a continued command meets a comment: a ``\\`` before
    the comment (it escapes a space, and the command ends at the comment), or a
    comment on a line of a continued command whose next line is indented as its
    continuation (bash runs that line as a command of its own)."""
    problems = []
    lines = body.splitlines()
    continuing = False
    for number, line in enumerate(lines, 1):
        code, comment = _split_comment(line)
        ends_continued = line.rstrip().endswith("\\")
        following = lines[number] if number < len(lines) else ""
        meant_to_go_on = following[:1].isspace() and bool(following.strip())
        if comment and (code.rstrip().endswith("\\")
                        or ((continuing or ends_continued) and meant_to_go_on)):
            problems.append(f"line {number}: {line.strip()}")
        continuing = ends_continued and not comment
    return problems


def _split_comment(line: str) -> tuple[str, str]:
    """``line``'s code and its comment (a ``#`` starting a word, outside quotes)."""
    unquoted = re.sub(r"'[^']*'|\"(?:\\.|[^\"\\])*\"", lambda m: "x" * len(m[0]), line)
    found = re.search(r"(^|\s)#", unquoted)
    if found is None:
        return line, ""
    start = found.start() + len(found[1])
    return line[:start], line[start:]


def page_ids() -> list[str]:
    return [f"{page}:{line}" for page, line, _ in blocks()]


def test_the_pages_have_shell_blocks_to_check() -> None:
    # The reader finds the blocks it should (indented ones inside lists included).
    pages = {page for page, _, _ in blocks()}
    assert {"README.md", "security.md", "reliability.md"} <= pages
    assert len(blocks()) >= 15


@pytest.mark.parametrize(("page", "line", "body"), blocks(), ids=page_ids())
def test_each_block_parses_and_no_command_continues_into_a_comment(
    page: str, line: int, body: str,
) -> None:
    checked = subprocess.run(["bash", "-n"], input=body, text=True, capture_output=True,
                             check=False)
    assert checked.returncode == 0, f"{page}:{line}: {checked.stderr}"
    assert continued_into_comments(body) == [], f"{page}:{line}"


def test_the_comment_check_finds_a_comment_after_a_continued_line() -> None:
    bad = "prohost agent run \\\n  --allow-write ~/.m2 \\   # a cache\n  --repos x\n"
    assert continued_into_comments(bad) == ["line 2: --allow-write ~/.m2 \\   # a cache"]
    bad_end = "prohost agent run --allow-write x  # why \\\n  --repos x\n"
    assert continued_into_comments(bad_end) != []
    good = "prohost agent run \\\n  --repos x   # at the end: fine\nls  # a comment\n"
    assert continued_into_comments(good) == []
    assert continued_into_comments("echo '#not a comment' \\\n  x\n") == []


@pytest.fixture
def person(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """The environment of a person who has what the pages assume, and its home."""
    home = tmp_path / "home"
    git_repo(home / "code" / "app")
    for folder in (".ssh", ".claude", ".claude-work", ".claude-personal", ".codex-work"):
        (home / folder).mkdir(parents=True, exist_ok=True)
    (home / ".claude" / "settings.json").write_text("{}\n")
    stand_ins = tmp_path / "bin"
    stand_ins.mkdir()
    for name in STAND_INS:
        program = stand_ins / name
        program.write_text("#!/bin/sh\necho 1.0.0\n")
        program.chmod(0o755)
    for name in ABSOLUTE_PLACES.values():
        (tmp_path / name).mkdir()
    agent_socket = socket.socket(socket.AF_UNIX)
    agent_socket.bind(str(tmp_path / "agent.sock"))
    agent_socket.close()
    env = clean_env(tmp_path / "prohost-home", HOME=str(home),
                    PATH=f"{stand_ins}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
                    SSH_AUTH_SOCK=str(tmp_path / "agent.sock"))
    return env, tmp_path


def prohost_head() -> list[str]:
    program = ROOT / PROHOST
    return [str(program)] if program.exists() else [sys.executable, "-m", "prohost"]


def test_every_command_is_run_here_or_named_with_the_reason(
    person: tuple[dict[str, str], Path],
) -> None:
    env, tmp_path = person
    ran = 0
    for page, line, body in blocks():
        where = f"{page}:{line}"
        lines = commands(body)
        if lines and all(command.startswith(FILE_COMMANDS) for command in lines):
            done = subprocess.run(["bash", "-e"], input=body, text=True, env=env, cwd=ROOT,
                                  capture_output=True, check=False, timeout=60)
            assert done.returncode == 0, f"{where}: {done.stderr}"
            ran += 1
            continue
        for command in lines:
            if any(command.startswith(known) for known in NOT_RUN):
                continue
            words = shlex.split(command)
            assert words[:3] == [PROHOST, "agent", "run"], (
                f"{where}: `{command}` is neither run by this test nor named in NOT_RUN "
                "with the reason")
            # As the person's shell would expand it: ~ and $VARIABLES.
            expanded = subprocess.run(
                ["bash", "-c", 'printf "%s\\0" ' + command.split(" ", 3)[3]],
                text=True, env=env, capture_output=True, check=True).stdout
            flags = [str(tmp_path / ABSOLUTE_PLACES[word]) if word in ABSOLUTE_PLACES
                     else word for word in expanded.split("\0")[:-1]]
            checked = subprocess.run(
                [*prohost_head(), "agent", "install-daemon", "--print", *flags],
                text=True, env=env, cwd=ROOT, capture_output=True, check=False, timeout=60)
            assert checked.returncode == 0, f"{where}: `{command}`: {checked.stderr}"
            ran += 1
    assert ran >= 6
