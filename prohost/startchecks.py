"""What ``agent run`` and ``agent install-daemon`` check before anything starts.

Settings under which every run would fail are refused at the terminal, with exit
status 2 and one line per problem naming the flag and what to do, instead of a
harness that connects, accepts every run and fails each one far from the person
who can fix it (issue 31, point 2). One function, :func:`start_problems`, for
both commands, so the foreground harness and the service refuse the same things:
the program ``--exec`` runs, the ``--workdir``, and each ``--repos`` checkout.

Beside :mod:`prohost.options` and :mod:`prohost.execline` (it reads the ``--exec``
line with the latter's rules), below the engine: it runs before the engine is
imported.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from prohost.execline import (
    PACKAGE_RUNNERS,
    is_interpreter,
    program_index,
    script_index,
    split_command,
)
from prohost.options import Options
from prohost.repospec import is_checkout

#: Shell builtins and keywords: the shell runs them, nothing on the PATH need exist
#: (``cd x && claude`` is the shell's business: what follows is not guessed at).
SHELL_BUILTINS = frozenset({
    "cd", "export", "source", ".", "eval", "set", "unset", "if", "for", "while", "until",
    "case", "{", "(", "!", "builtin", ":", "true", "false", "echo", "printf", "read",
    "test", "[", "trap", "umask", "ulimit", "alias", "time", "type", "wait", "shift",
})
#: A program word with any of these is expanded by the shell (``$AGENT``, ``~/bin/x``,
#: a glob): its value is not known here, so it is not checked.
_SHELL_SYNTAX = frozenset("$`()<>|;&*?[]{}~")


def exec_problem(options: Options, path: str, path_name: str = "the PATH") -> str | None:
    """Why the program ``--exec`` runs would not start with ``path`` as its PATH, or
    None. The program is the first word after any ``VAR=value`` words and launchers
    (:func:`prohost.execline.program_index`); a shell builtin passes; for an
    interpreter followed by a script (``python agent.py``), the script must exist."""
    words = split_command(options.exec_command)
    index = program_index(words)
    if index is None:
        return None
    word = words[index]
    if word in SHELL_BUILTINS or any(char in _SHELL_SYNTAX for char in word):
        return None
    # The agent runs in the workdir, or with --repos in its worktree of the first
    # checkout, which holds that checkout's files: relative paths point there.
    base = options.repos[0] if options.repos else options.workdir
    where = f" (relative to {base}, where the agent starts)"
    if "/" in word:
        candidate = base / word
        if not (candidate.is_file() and os.access(candidate, os.X_OK)):
            return (f"--exec runs {word}, which is not an executable file"
                    + ("" if word.startswith("/") else where) + "; give its absolute path")
    elif shutil.which(word, path=path) is None:
        return (f"--exec runs {word!r}, which is not on {path_name} ({path}); install it, "
                "or give its absolute path in --exec")
    if not is_interpreter(word) or os.path.basename(word) in PACKAGE_RUNNERS:
        return None
    script = script_index(words, index)
    if script is None or words[script - 1] == "-m":
        return None  # code on the line, stdin, or a module: nothing to look for
    name = words[script]
    if any(char in _SHELL_SYNTAX for char in name) or (base / name).is_file():
        return None
    return (f"--exec runs {word} {name}, and there is no file {name}"
            + ("" if name.startswith("/") else where) + "; give the script's absolute path")


def workdir_problem(workdir: Path) -> str | None:
    """Why ``--workdir`` cannot be the agent's working directory, or None.

    A missing one is made and removed again (the harness makes it for real): the
    only honest answer to "can it be made" on, say, ``/proc``, where root's
    ``os.access`` says yes and ``mkdir`` says no.
    """
    if workdir.exists():
        if not workdir.is_dir():
            return f"--workdir {workdir} exists and is not a directory; name a directory"
        if not os.access(workdir, os.W_OK | os.X_OK):
            return f"--workdir {workdir} is not writable by this user; name another one"
        return None
    missing = [workdir, *(p for p in workdir.parents if not p.exists())]
    try:
        workdir.mkdir(parents=True)
    except OSError as exc:
        return (f"--workdir {workdir} cannot be made ({exc.strerror or exc}); "
                "name a directory this user can create")
    for folder in missing:  # deepest first: each is empty once its child is gone
        try:
            folder.rmdir()
        except OSError:
            break
    return None


def _toplevel(path: Path) -> str | None:
    """The top of the git work tree ``path`` is inside, or None (not in one, no git)."""
    try:
        result = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "--show-toplevel"], stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=30, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    return result.stdout.strip() or None


def repo_problems(options: Options) -> list[str]:
    """``--repos`` entries that are missing, not git checkouts, or not their top level."""
    problems = []
    for repo in options.repos:
        if not repo.exists():
            problems.append(f"--repos: {repo} does not exist; name an existing git checkout")
        elif not repo.is_dir():
            problems.append(f"--repos: {repo} is not a directory; name a git checkout")
        elif not is_checkout(repo):
            top = _toplevel(repo)
            if top is not None:
                problems.append(f"--repos: {repo} is inside the git checkout {top}, not its "
                                f"top level; name {top}")
            else:
                problems.append(f"--repos: {repo} is not a git checkout; run `git init` in "
                                "it or name a checkout")
    return problems


def start_problems(options: Options, path: str, path_name: str = "the PATH") -> list[str]:
    """Every reason the harness these options describe would fail its runs, one line
    each (empty: it can start). ``path``: the PATH the agent will get, called
    ``path_name`` in the message."""
    found = [workdir_problem(options.workdir), exec_problem(options, path, path_name)]
    return [problem for problem in found if problem] + repo_problems(options)
