"""A bubblewrap confinement for the harness's own git, as the run room makes one (the
confined-git tests)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from prohost.engine.repos.gitsession import Confine
from prohost.engine.sandbox import Policy, confined_command, seccomp


def bwrap_confine(hidden: tuple[Path, ...] = ()) -> Confine:
    """The harness's way to confine its git on a run's places
    (:func:`prohost.engine.run.checkouts.git_confinement`), with ``hidden`` hidden."""

    def confine(argv: list[str], readable: Sequence[Path],
                writable: Sequence[Path]) -> tuple[list[str], int | None]:
        policy = Policy(writable=tuple(writable), readable=tuple(readable), hidden=hidden)
        fd = seccomp.filter_fd()
        return confined_command(policy, argv, seccomp_fd=fd), fd

    return confine
