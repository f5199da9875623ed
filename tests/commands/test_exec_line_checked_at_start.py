"""``--exec`` with shell syntax after the agent is refused at start (issue 20, point 7).

The claude and codex brains append their flags (``--output-format stream-json``,
``--resume``, ``--json``, ``resume``) to the end of the user's line. After ``# work``
they were a comment, after ``| tee`` or ``; echo`` another command's arguments: the
run then failed far from the cause, or a conversation silently lost its session.
Now ``prohost agent run`` (a real process) exits 2 with one line naming --exec, like
any other bad flag; lines that only put something before the agent still work.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from prohost import cli
from prohost.options import OptionError, options_from_args
from tests.kits.paths import ROOT
from tests.kits.program import run_cli


@pytest.mark.parametrize("command", ["run", "install-daemon"])
def test_a_comment_after_the_agent_fails_at_start_with_exit_2(
    tmp_path: Path, command: str
) -> None:
    args = ["agent", command, "--exec", "claude -p # the work bot", "--dry-run"]
    if command == "install-daemon":
        args.append("--print")
    result = run_cli(tmp_path, *args, cwd=ROOT)
    assert result.returncode == 2, result
    last = result.stderr.strip().splitlines()[-1]
    assert "--exec" in last and "comment" in last and "'# the work bot'" in last
    assert "--resume" in last  # what would have been lost
    assert not (tmp_path / "home").exists()  # refused before anything was touched


def _parse(exec_line: str, brain: str | None = None) -> object:
    argv = ["agent", "run", "--exec", exec_line]
    if brain:
        argv += ["--brain", brain]
    ns = cli.build_parser().parse_args(argv)
    return options_from_args(ns, {"HOME": "/nowhere", "PROHOST_HOME": "/nowhere/p"}, Path("/"))


@pytest.mark.parametrize(
    ("line", "brain", "named"),
    [
        ("claude -p # work", None, "a comment ('# work')"),
        ("claude -p | tee log", None, "a pipe ('|')"),
        ("claude -p |& ts", None, "a pipe ('|&')"),
        ("claude -p; echo done", None, "';' after claude"),
        ("nice -n 5 claude -p || notify", None, "'||' after claude"),
        ("claude -p &", None, "'&' (a background job)"),
        ("claude -p &&", None, "a '&&' at the end"),
        ("claude -p\n", None, "a '\\n' at the end"),
        ("codex exec # hi", None, "a comment ('# hi')"),
        ("codex && true", None, "'&&' after codex"),
        ("(claude -p)", "claude", "parentheses"),
        ("{ claude -p; }", "claude", "'}' at the end"),
        ("./my-claude | tee log", "claude", "a pipe"),
    ],
)
def test_shell_syntax_after_the_agent_is_refused(line: str, brain: str | None, named: str) -> None:
    with pytest.raises(OptionError) as raised:
        _parse(line, brain)
    message = str(raised.value)
    assert message.startswith("--exec holds shell syntax, " + named), message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("line", "brain"),
    [
        ("cd ~/src && claude -p", "claude"),
        ("source ~/.env; exec claude -p", "claude"),
        ("FOO=1 claude -p 2>&1", None),
        ("claude -p 2>>err.log", None),
        ("claude -p &>log", None),
        ("claude -p --append-system-prompt 'a # b; c | d &'", None),
        ("claude -p --model \"$(cat model | head -1)\"", None),
        ("claude -p --model `cat m|head -1`", None),
        ("claude -p --label issue#3", None),
        ("claude -p \\# not-a-comment", None),
        ("codex -m o3", None),
        # The plain brain appends nothing: the line is the user's to write.
        ("./agent.sh | tee log # mine", None),
        ("claude -p | tee log", "plain"),
    ],
)
def test_lines_that_keep_the_agent_last_are_accepted(line: str, brain: str | None) -> None:
    _parse(line, brain)
