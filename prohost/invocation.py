"""How a command printed for a person names this program, so that it runs as printed.

A person who installed prohost in a virtual environment and runs ``.venv/bin/prohost``
has no ``prohost`` on their PATH: a banner that says ``prohost agent pair …`` would
answer "command not found". Every command the program tells a person to run is made
here (:func:`command`), and names the program as it can be run:

- ``prohost`` when the ``prohost`` found on PATH is this very program;
- else the path of the running program (``sys.argv[0]`` made absolute);
- else, when it runs as a module (``python -m prohost``, the service's way) or from a
  process that is not one of prohost's entry points (a test runner), the
  interpreter's path followed by ``-m prohost``.

Words are quoted for a POSIX shell (a path with a space stays one word).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Mapping

#: The name the console script is installed under (pyproject's ``[project.scripts]``).
NAME = "prohost"


def _runs_as_module() -> bool:
    """Whether this process is ``python -m prohost`` (its ``__main__`` is ours)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return spec is not None and spec.name in (f"{NAME}.__main__", NAME)


def _script() -> str | None:
    """The console script this process runs as (absolute), or None when it is not
    one (a module run, a test runner, an embedding)."""
    argv0 = sys.argv[0] if sys.argv else ""
    if _runs_as_module() or os.path.basename(argv0) != NAME:
        return None
    return os.path.abspath(argv0)


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def program(env: Mapping[str, str] | None = None) -> list[str]:
    """The words that run this program, as :func:`command` prints them (see the
    module docstring). ``env``: whose PATH to look on (default: this process's)."""
    path = (os.environ if env is None else env).get("PATH")
    on_path = shutil.which(NAME, path=path)
    script = _script()
    if script is not None:
        return [NAME] if on_path is not None and _same_file(on_path, script) else [script]
    # A module run: the PATH's prohost is this one when it is the console script
    # installed beside this interpreter (a virtual environment's bin/, pip's).
    beside = os.path.join(os.path.dirname(sys.executable), NAME)
    if on_path is not None and _same_file(on_path, beside):
        return [NAME]
    return [sys.executable, "-m", NAME]


def command(*args: str, env: Mapping[str, str] | None = None) -> str:
    """``prohost ARGS`` as the person can run it: ``command("agent", "run")`` is
    ``prohost agent run``, or ``/home/me/app/.venv/bin/prohost agent run`` when no
    ``prohost`` on PATH is this one. Each word is quoted for a POSIX shell; a word
    the caller wants left to the reader (``...``, ``CODE``) is passed as it is
    meant to be read."""
    return shlex.join([*program(env), *args])
