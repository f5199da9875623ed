"""The --exec line as shell words: the program every brain finds, and word positions
that let a brain edit the line without re-quoting the user's text."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prohost.engine.agent.brains import Brain, brain_for
from prohost.engine.agent.brains.claude import ClaudeBrain
from prohost.engine.agent.brains.codex import CodexBrain
from prohost.execline import program_name, split_command, word_spans
from prohost.options import BRAIN_CHOICES


@pytest.mark.parametrize(("line", "program"), [
    ("claude -p", "claude"),
    ("/usr/local/bin/codex exec", "codex"),
    ("env ANTHROPIC_MODEL=opus nohup claude -p", "claude"),
    ("CODEX_HOME=/srv/codex exec codex", "codex"),
    ("./bin/claude -p", "claude"),
    ("/opt/a=b/claude -p", "claude"),
    ("FOO=1 BAR=2", ""),
    ("", ""),
    # A launcher's own options, and the values some of them take, come before it.
    ("nice -n 10 claude -p", "claude"),
    ("nice -5 codex exec", "codex"),
    ("nice --adjustment=3 claude", "claude"),
    ("env -i HOME=/srv -u TERM claude -p", "claude"),
    ("command -p claude", "claude"),
    # An option after the program is the program's.
    ("claude -n 10", "claude"),
])
def test_the_program_is_the_first_word_that_is_no_assignment_or_launcher(
    line: str, program: str,
) -> None:
    assert program_name(line) == program


@pytest.mark.parametrize("line", [
    "env CLAUDE_CONFIG_DIR=/srv/c claude -p", "FOO=1 claude", "claude", "exec claude -p",
    "nice -n 10 claude -p",
])
def test_claude_and_auto_agree_on_the_program(line: str) -> None:
    assert isinstance(brain_for("auto", line), ClaudeBrain)
    version = ClaudeBrain(line).version_command()
    assert version is not None and version.endswith("claude --version")


def test_both_brains_ask_the_same_program_for_its_version() -> None:
    line = "env HOME=/srv/agent codex -m o3"
    assert isinstance(brain_for("auto", line), CodexBrain)
    # Both keep the user's text as written, cut after the program's word.
    assert CodexBrain(line).version_command() == "env HOME=/srv/agent codex --version"
    assert ClaudeBrain(line).version_command() == "env HOME=/srv/agent codex --version"


words_st = st.lists(
    st.text(st.sampled_from("ab $~*'\"\\=-/"), min_size=1, max_size=6), min_size=1, max_size=6,
)


@pytest.mark.protocol("§5")
@given(words=words_st, gaps=st.lists(st.sampled_from([" ", "  ", "\t"]), min_size=6, max_size=6))
def test_word_spans_find_each_word_where_the_user_wrote_it(
    words: list[str], gaps: list[str],
) -> None:
    quoted = [shlex.quote(word) for word in words]
    line = "".join(gap + word for gap, word in zip(gaps, quoted, strict=False))
    spans = word_spans(line)
    assert [value for _, _, value in spans] == words == split_command(line)
    assert [line[start:end] for start, end, _ in spans] == quoted


@pytest.mark.parametrize("choice", BRAIN_CHOICES)
def test_every_brain_choice_of_the_command_line_names_a_brain(choice: str) -> None:
    """--brain's one list of choices (prohost.options) is the list brain_for knows."""
    assert isinstance(brain_for(choice, "claude -p"), Brain)


def test_a_brain_outside_the_choices_is_refused_naming_them() -> None:
    with pytest.raises(ValueError) as caught:
        brain_for("gemini", "claude -p")
    assert str(caught.value) == (
        "unknown brain 'gemini'; choose one of auto, acp, claude, codex, plain")
