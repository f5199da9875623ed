"""The user's ``--exec`` line read as shell words, for every brain.

A brain only ever appends to the user's line or cuts it at a word boundary: it
never re-joins the words it parsed, since quoting them again could change what
``$HOME``, ``~`` or a glob mean to the shell. So this module answers questions
about the line (its words, its program, whether a flag is there) and gives word
positions in the original text (:func:`word_spans`) for the edits.

It sits below the engine, beside :mod:`prohost.options`: the brains
(:mod:`prohost.engine.agent.brains`) build their command lines with it, and the
flag parser refuses an ``--exec`` line a brain could not drive
(:func:`shell_tail_problem`) without importing the engine.
"""

from __future__ import annotations

import os
import re
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


#: Command lines that start an agent speaking the Agent Client Protocol on its
#: stdio, which ``--brain auto`` drives with the ACP brain: the program's base name
#: and a word after it that selects ACP mode (``None``: the program only speaks
#: ACP). One list; the README's brain table shows it. After ``npx``/``bunx``/``pnpx``
#: the package is the program, by its name or its base name
#: (``npx -y @zed-industries/codex-acp``, ``npx @google/gemini-cli --acp``). The
#: modes are those of the ACP registry (agentclientprotocol/registry, each agent's
#: ``agent.json``) and the agents' own documentation.
ACP_COMMANDS: tuple[tuple[str, str | None, str], ...] = (
    # (program, the word that puts it in ACP mode or None, the agent: whose own
    # folders a confined run gets, prohost.engine.sandbox.defaults.AGENT_FOLDERS)
    ("gemini", "--acp", "gemini"),                  # Gemini CLI
    ("gemini", "--experimental-acp", "gemini"),     # Gemini CLI, older builds
    ("@google/gemini-cli", "--acp", "gemini"),
    ("qwen", "--acp", "qwen"),                      # Qwen Code
    ("qwen", "--experimental-acp", "qwen"),
    ("@qwen-code/qwen-code", "--acp", "qwen"),
    ("copilot", "--acp", "copilot"),                # GitHub Copilot CLI (npm @github/copilot)
    ("opencode", "acp", "opencode"),                # OpenCode
    ("@opencode/cli", "acp", "opencode"),
    ("goose", "acp", "goose"),                      # Goose
    ("cursor-agent", "acp", "cursor"),              # Cursor CLI
    ("kimi", "acp", "kimi"),                        # Kimi CLI
    ("kimi", "--acp", "kimi"),                      # Kimi CLI, older builds
    ("claude-code-acp", None, "claude"),            # Claude Code through Zed's adapter
    ("claude-agent-acp", None, "claude"),           # the same adapter, renamed upstream
    ("codex-acp", None, "codex"),                   # Codex through Zed's adapter
)
#: Interpreters whose next word is a package to fetch and run, not a file.
PACKAGE_RUNNERS = frozenset({"npx", "bunx", "pnpx", "uvx"})
#: Shells, whose ``-c`` may come in a cluster (``-lc``, ``-ic``).
SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh"})


def speaks_acp(line: str) -> bool:
    """Whether ``line`` starts an agent in ACP mode (:data:`ACP_COMMANDS`)."""
    return acp_agent(line) is not None


def acp_agent(line: str) -> str | None:
    """Which agent an ACP command line starts (``gemini``, ``claude``, …: the third
    column of :data:`ACP_COMMANDS`), or ``None`` when it starts none in ACP mode."""
    words = split_command(line)
    index = program_index(words)
    if index is None:
        return None
    names = {os.path.basename(words[index])}
    rest = words[index + 1:]
    if names & PACKAGE_RUNNERS:
        # npx [-y] @scope/name[@version] …: the package is the program (an
        # option's value, `--package foo`, is not).
        script = script_index(words, index)
        if script is None:
            return None
        package, rest = words[script], words[script + 1:]
        scope = "@" if package.startswith("@") else ""
        name = scope + package.removeprefix("@").split("@", 1)[0]
        names = {name, name.rsplit("/", 1)[-1]}
    for program, mode, agent in ACP_COMMANDS:
        if program in names and (mode is None or mode in rest):
            return agent
    return None


#: Programs that run a script, module or package named by a later word: the agent is
#: that script, so its version is the script's own, never the interpreter's (the
#: demo's agent was shown as ``claude Python 3.11.7``).
INTERPRETERS = frozenset({"python", "python3", "pypy", "pypy3", "node", "nodejs", "bun",
                          "ruby", "perl", "php", "sh", "bash", "zsh", "npx", "bunx",
                          "pnpx", "uvx"})
_VERSIONED_PYTHON = re.compile(r"(python|pypy)\d+(\.\d+)*")
#: An interpreter's options that take the next word as their value.
_INTERPRETER_VALUE_OPTIONS = frozenset({"-W", "-X", "-r", "--require", "-p", "--package",
                                        "--from", "--with"})
#: Options after which the program is code on the line, not a file: no version to ask.
_INLINE_CODE_OPTIONS = frozenset({"-c", "-e", "--eval", "--command"})


def is_interpreter(program: str) -> bool:
    """Whether ``program`` (a word or path) runs a script named after it."""
    name = os.path.basename(program)
    return name in INTERPRETERS or _VERSIONED_PYTHON.fullmatch(name) is not None


def script_index(words: Sequence[str], program: int) -> int | None:
    """For an interpreter at ``words[program]``, which word names what it runs (the
    script, the package, or for ``-m`` the module); ``None`` when the line runs
    code given inline (``-c``, or a shell's cluster ``-lc``), reads it from stdin,
    or names none."""
    shell = os.path.basename(words[program]) in SHELLS
    skip_value = False
    for index in range(program + 1, len(words)):
        word = words[index]
        if skip_value:
            skip_value = False
            continue
        if word in _INLINE_CODE_OPTIONS or word == "-":
            return None
        if shell and word.startswith("-") and not word.startswith("--") and "c" in word:
            return None  # `bash -lc 'claude -p'`: the next word is code, not a script
        if word == "-m":
            return index + 1 if index + 1 < len(words) else None
        if word.startswith("-"):
            skip_value = word in _INTERPRETER_VALUE_OPTIONS
            continue
        return index
    return None


def version_command(line: str) -> str | None:
    """``line`` cut after the program it really runs, plus ``--version``: the program,
    or for an interpreter (:data:`INTERPRETERS`) the script, module or package it runs
    (``python agent.py --version``, ``npx pkg --version``); ``None`` when that is
    code on the line or nothing. The cut keeps the ``NAME=value`` words and
    launchers, and ``$HOME/bin/claude`` or ``~/bin/codex`` still expanded by the
    shell (re-quoting the parsed word would make ``$HOME`` a literal directory
    name)."""
    spans = word_spans(line)
    words = [word for _, _, word in spans]
    index = program_index(words)
    if index is None:
        return None
    if is_interpreter(words[index]):
        script = script_index(words, index)
        if script is None:
            return None
        index = script
    return line[: spans[index][1]] + " --version"


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


# --- shell syntax that would take the appended flags away -----------------------------

#: What the claude and codex brains append, as named in the error.
_APPENDED = {"claude": "--output-format stream-json, --resume", "codex": "--json, resume"}
#: Words that close a compound command: a flag appended after one is a syntax error.
_CLOSERS = frozenset({"}", "done", "fi", "esac"})


def _skip_substitution(line: str, index: int) -> int:
    """Index just past the ``$(...)`` or backquoted text starting at ``index``
    (taken whole: its operators belong to the inner command)."""
    if line[index] == "`":
        index += 1
        while index < len(line) and line[index] != "`":
            index += 2 if line[index] == "\\" else 1
        return index + 1
    depth, index = 0, index + 1  # at "(" of "$("
    while index < len(line):
        char = line[index]
        if char == "\\":
            index += 2
            continue
        if char in "'\"":
            end = line.find(char, index + 1)
            index = len(line) if end < 0 else end + 1
            continue
        depth += {"(": 1, ")": -1}.get(char, 0)
        index += 1
        if depth == 0:
            break
    return index


def _shell_tokens(line: str) -> tuple[list[tuple[int, str]], str | None]:
    """The unquoted control operators of ``line`` with their positions, and the
    comment that ends it (``None`` without one). Quotes, backslashes, ``$(...)``
    and backquotes are followed; redirections (``2>&1``, ``>|``, ``&>``) are words."""
    operators: list[tuple[int, str]] = []
    index, size, word_start = 0, len(line), True
    while index < size:
        char = line[index]
        if char == "\\":
            index, word_start = index + 2, False
        elif char in "'\"":
            end = line.find(char, index + 1)
            while char == '"' and end > 0 and line[end - 1] == "\\":
                end = line.find(char, end + 1)
            index, word_start = (size if end < 0 else end + 1), False
        elif char == "`" or line.startswith("$(", index):
            index, word_start = _skip_substitution(line, index + (char == "$")), False
        elif char == "#" and word_start:
            end = line.find("\n", index)
            return operators, line[index:] if end < 0 else line[index:end]
        elif char in "|&;()\n" and not (
            char in "|&" and index and line[index - 1] in "<>"
        ) and not (char == "&" and line.startswith("&>", index)):
            two = line[index:index + 2]
            op = two if two in ("&&", "||", ";;", "|&") else char
            operators.append((index, op))
            index, word_start = index + len(op), True
        else:
            word_start = char.isspace()
            index += 1
    return operators, None


def shell_tail_problem(brain: str, exec_line: str) -> str | None:
    """Why ``--exec`` cannot be driven by ``brain`` (one line naming the flag), or None.

    The claude and codex brains append their flags to the end of the user's line.
    Shell syntax after the agent takes them away: a comment swallows them, a pipe or
    ``;`` gives them to the next command, ``&`` to a new one. The run would then fail
    far from the cause (no stream format, a resume that never happens), so the line
    is refused at start. A command before the agent (``cd x && claude -p``) is fine.
    """
    if brain == "auto":
        program = program_name(exec_line)
        brain = program if program in _APPENDED else "plain"
    if brain not in _APPENDED:
        return None  # the plain brain runs the line as it is
    operators, comment = _shell_tokens(exec_line)
    found: str | None = None
    if comment is not None:
        found = f"a comment ({comment.strip()!r})"
    for position, op in operators:
        if found:
            break
        if op in ("|", "|&"):
            found = f"a pipe ({op!r})"
        elif op == "&":
            found = "'&' (a background job)"
        elif op in "()":
            found = "parentheses (a subshell)"
        elif not exec_line[position + len(op):].strip():
            found = f"a {op!r} at the end"
    if found is None and operators:
        bounds = [0, *(p + len(op) for p, op in operators)]
        ends = [p for p, _ in operators]
        segments = [exec_line[start:end] for start, end in zip(bounds[:-1], ends, strict=True)]
        last_words = split_command(exec_line[bounds[-1]:])
        for segment, (_, op) in zip(segments, operators, strict=True):
            words = split_command(segment)
            index = program_index(words)
            if index is not None and os.path.basename(words[index]) == brain:
                found = f"{op!r} after {brain}, so another command comes last"
                break
        else:
            if last_words[:1] and last_words[0] in _CLOSERS:
                found = f"{last_words[0]!r} at the end"
    if found is None:
        return None
    return (
        f"--exec holds shell syntax, {found}: the {brain} brain appends its flags "
        f"({_APPENDED[brain]}) to the end of the line and they would not reach {brain}; "
        "remove it, or put the command in a script and give --exec that script"
    )
