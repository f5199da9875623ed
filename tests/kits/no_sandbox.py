"""A machine without bubblewrap, or without any confinement, for the tests of what
the harness says and does there (§13's fallback, ``--sandbox required``'s refusal).

In this process: :func:`without_bubblewrap` and :func:`without_confinement` patch
what the probe asks the machine (where bubblewrap is, the kernel's Landlock ABI), so
the probe's own code path answers. For a ``prohost`` subprocess, run this file as
the program (:func:`program`): it patches the same, then runs ``python -m prohost``.
The product reads no switch of its own for either.
"""

from __future__ import annotations

import errno
import importlib
import runpy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

SCRIPT = str(Path(__file__).resolve())


def _no_landlock() -> int:
    raise OSError(errno.ENOSYS, "Landlock is not in this kernel")


def _patch(set_: Callable[[Any, str, Any], None], what: str) -> None:
    """``set_`` (monkeypatch's setattr, or plain setattr in a child) the probe's
    questions to the machine: no bubblewrap; with ``none``, no Landlock and no
    ``sandbox-exec`` either."""
    from prohost.engine.sandbox import bwrap, landlock

    # The module (the package's `probe` is its function of the same name).
    probe_module = importlib.import_module("prohost.engine.sandbox.probe")

    set_(bwrap, "find", lambda: None)
    if what == "none":
        set_(landlock, "abi_version", _no_landlock)
        set_(probe_module, "SANDBOX_EXEC", "/nonexistent/sandbox-exec")


def without_bubblewrap(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process finds no bubblewrap (Landlock alone, where the kernel has it)."""
    _patch(monkeypatch.setattr, "bwrap")


def without_confinement(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process finds no way to confine runs at all."""
    _patch(monkeypatch.setattr, "none")


def program(what: str) -> tuple[str, ...]:
    """``python -m prohost`` on a machine with no bubblewrap (``bwrap``) or no
    confinement at all (``none``)."""
    return (sys.executable, SCRIPT, what, "--")


if __name__ == "__main__":
    what, separator, *rest = sys.argv[1:]
    assert separator == "--" and what in ("bwrap", "none"), sys.argv
    sys.path.insert(0, str(Path(SCRIPT).parents[2]))
    _patch(setattr, what)
    sys.argv = ["prohost", *rest]
    runpy.run_module("prohost", run_name="__main__", alter_sys=True)
