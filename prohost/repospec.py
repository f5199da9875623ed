"""``--repos``: the git checkouts a harness gives each conversation a private worktree
of, named on the command line and checked without running git.

Below the engine and beside :mod:`prohost.options`, which parses the flag with it:
:func:`is_checkout` is asked again by the worktrees (:mod:`prohost.engine.repos`)
and the start-up notes, so neither imports the other's room.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

REPOS_USAGE = "--repos needs a comma-separated list of git checkouts, e.g. --repos ~/code/app"


class ReposFlagError(ValueError):
    """``--repos`` is unusable; the message is one line saying why."""


def _expand_home(raw: str, env: Mapping[str, str]) -> str:
    # `--repos=~/a,~/b` reaches us unexpanded: the shell only expands a leading ~.
    if raw == "~" or raw.startswith("~/"):
        home = env.get("HOME") or str(Path.home())
        return home + raw[1:]
    if raw.startswith("~"):
        expanded = os.path.expanduser(raw)  # ~user/...: the password database knows
        if expanded == raw:
            raise ReposFlagError(f"--repos: no such user in {raw!r}; write the full path")
        return expanded
    return raw


def parse_repos(
    raw: str | Sequence[str], *, env: Mapping[str, str], cwd: Path, require_checkouts: bool
) -> tuple[Path, ...]:
    """The checkouts ``--repos`` names, in order: absolute and normalised. ``raw`` is
    one value or every value of the repeated flag, which is the same as one value
    joining them with commas. A checkout named twice (in any spelling) is refused:
    it is a typo for another one more often than not.

    ``require_checkouts`` is for installing a daemon, where a wrong path would only
    show up later in a log nobody reads; ``agent run`` passes False and warns
    instead (see :func:`is_checkout`), since a checkout may appear later.
    """
    values = [raw] if isinstance(raw, str) else list(raw)
    repos: dict[Path, str] = {}  # each checkout, and how it was first written
    for value in values:
        if not value.strip():
            raise ReposFlagError(REPOS_USAGE)
        for entry in value.split(","):
            entry = entry.strip()
            if not entry:
                # `a,,b` or a trailing comma is almost always a typo for a path.
                raise ReposFlagError(f"{REPOS_USAGE} (got an empty entry in {value!r})")
            # Absolute now: the agent runs elsewhere, and a daemon has no cwd of ours.
            path = Path(os.path.normpath(cwd / _expand_home(entry, env)))
            if path in repos:
                spelled = ("" if entry == repos[path]
                           else f" (as {repos[path]!r} and as {entry!r})")
                raise ReposFlagError(
                    f"--repos names {path} twice{spelled}; give each checkout once"
                )
            repos[path] = entry
    if require_checkouts:
        for path in repos:
            if not path.exists():
                raise ReposFlagError(f"--repos: {path} does not exist")
            if not is_checkout(path):
                raise ReposFlagError(f"--repos: {path} is not a git checkout (it has no .git)")
    return tuple(repos)


def is_checkout(path: Path) -> bool:
    """``path`` is the top of a git work tree: it has a ``.git`` folder, or a ``.git``
    file (a worktree or submodule). No subprocess: this runs while parsing flags."""
    dot_git = path / ".git"
    return dot_git.is_dir() or dot_git.is_file()
