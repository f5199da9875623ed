"""The user's ``--exec`` line read as shell words, for every brain.

A brain only ever appends to the user's line or cuts it at a word boundary: it
never re-joins the words it parsed, since quoting them again could change what
``$HOME``, ``~`` or a glob mean to the shell. So this module answers questions
about the line (its words, its program, whether a flag is there) and gives word
positions in the original text (:func:`word_spans`) for the edits.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence

#: Words before the program on an exec line that are not the program itself.
LAUNCHERS = frozenset({"env", "exec", "command", "nice", "nohup"})
#: A launcher's options that take the next word as their value (``nice -n 10``,
#: ``env -u NAME``): that word is not the program either.
LAUNCHER_VALUE_OPTIONS = frozenset({"-n", "--adjustment", "-u", "--unset", "-C", "--chdir"})


def split_command(line: str) -> list[str]:
    """Shell words of ``line``; an unbalanced quote gives the plain whitespace split."""
    try:
        return shlex.split(line)
    except ValueError:
        return line.split()


def program_index(words: Sequence[str]) -> int | None:
    """Which of ``words`` is the program: the first that is not ``NAME=value``, a
    launcher (:data:`LAUNCHERS`) or a launcher's option (``nice -n 10 claude``);
    ``None`` when there is none."""
    after_launcher = False
    skip_value = False
    for index, word in enumerate(words):
        if skip_value:
            skip_value = False
            continue
        if "=" in word.split("/", 1)[0] and not word.startswith(("/", ".")):
            continue
        if word in LAUNCHERS:
            after_launcher = True
            continue
        if after_launcher and word.startswith("-") and word != "-":
            skip_value = word in LAUNCHER_VALUE_OPTIONS
            continue
        return index
    return None


def program_name(line: str) -> str:
    """The program a command line runs (the rule of :func:`program_index`), as a base
    name (``/usr/local/bin/claude -p`` → ``claude``); ``""`` when it runs none."""
    words = split_command(line)
    index = program_index(words)
    return "" if index is None else os.path.basename(words[index])


def program_span(line: str) -> tuple[int, int] | None:
    """Where in ``line`` the program's word is (start, end), by the rule of
    :func:`program_index`; ``None`` when it runs none. ``line[:end]`` is the
    program with what comes before it (assignments, launchers), as written."""
    spans = word_spans(line)
    index = program_index([word for _, _, word in spans])
    return None if index is None else spans[index][:2]


def version_command(line: str) -> str | None:
    """``line`` cut after its program, plus ``--version``: the version comes from the
    program that will really run, with its ``NAME=value`` words and launchers, and
    ``$HOME/bin/claude`` or ``~/bin/codex`` still expanded by the shell (re-quoting
    the parsed word would make ``$HOME`` a literal directory name)."""
    span = program_span(line)
    return None if span is None else line[: span[1]] + " --version"


def has_flag(line: str, *flags: str) -> bool:
    """Whether ``line`` already passes one of ``flags`` (alone or as ``--flag=value``)."""
    for word in split_command(line):
        for flag in flags:
            if word == flag or word.startswith(flag + "="):
                return True
    return False


def word_spans(line: str) -> list[tuple[int, int, str]]:
    """Each shell word of ``line`` as (start, end, unquoted value).

    Edits must keep the user's own text as written (``$HOME``, ``~`` and globs
    expand in the shell), so the line is cut at word boundaries rather than
    re-joined from ``shlex.split``.
    """
    spans: list[tuple[int, int, str]] = []
    index, size = 0, len(line)
    while index < size:
        if line[index].isspace():
            index += 1
            continue
        start, quote = index, ""
        while index < size:
            char = line[index]
            if quote == "'":
                if char == "'":
                    quote = ""
            elif char == "\\":
                index += 1  # the next character is escaped, whatever it is
            elif quote == '"':
                if char == '"':
                    quote = ""
            elif char.isspace():
                break
            elif char in "'\"":
                quote = char
            index += 1
        end = min(index, size)
        raw = line[start:end]
        words = split_command(raw)
        spans.append((start, end, words[0] if len(words) == 1 else raw))
    return spans
