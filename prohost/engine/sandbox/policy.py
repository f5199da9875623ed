"""What a confined run may write, may read, and may not see: :class:`Policy`.

A policy names paths as the caller has them; :meth:`Policy.resolved` turns them into
real paths once, so a symbolic link never widens a grant (a link to ``~/.ssh`` is
hidden as ``~/.ssh`` is, because the rules are made on where it leads).
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs


def _paths(values: tuple[Path | str, ...] | list[Path | str]) -> tuple[Path, ...]:
    return tuple(Path(value) for value in values)


@attrs.frozen
class Policy:
    """The places of one confined run; everything else is read and execute only.

    ``writable``: read, write and execute, each whole hierarchy. ``readable``: read
    and execute, each whole hierarchy, granted even inside a hidden place (this is
    ``--allow-read``). ``hidden``: neither read nor written, unless a writable or
    readable grant names something inside it. A hidden place *inside* a writable or
    readable grant cannot be hidden (Landlock only adds rights): the grant wins.

    A writable *file* (``~/.claude.json``) can be written in place, but a program
    that replaces it atomically (a temporary file beside it, then a rename) needs
    its folder writable; grant the folder, or give the program its own.

    Paths may be given unresolved (``~`` is not expanded: give ``$HOME`` as the
    harness sees it). A path that does not exist when the run is prepared gets no
    grant: a writable folder must be made before :func:`~.prepare` (granting its
    nearest existing parent instead would widen the grant). A hidden place that does
    not exist yet stays hidden: its existing parents are walked as for any hidden
    place, so one created later is not readable by the run.
    """

    writable: tuple[Path, ...] = attrs.field(default=(), converter=_paths)
    readable: tuple[Path, ...] = attrs.field(default=(), converter=_paths)
    hidden: tuple[Path, ...] = attrs.field(default=(), converter=_paths)

    def resolved(self) -> Policy:
        """The same policy on real paths (absolute, links followed), each once.

        Grants that do not exist are dropped; hidden places are kept even when
        missing (see the class). Blocking: it reads the filesystem.
        """
        return Policy(
            writable=_existing(_real(self.writable)),
            readable=_existing(_real(self.readable)),
            hidden=_real(self.hidden),
        )


def _real(paths: tuple[Path, ...]) -> tuple[Path, ...]:
    seen: dict[Path, None] = {}
    for path in paths:
        seen.setdefault(Path(os.path.realpath(os.path.abspath(path))), None)
    return tuple(seen)


def _existing(paths: tuple[Path, ...]) -> tuple[Path, ...]:
    return tuple(path for path in paths if os.path.lexists(path))


def is_within(path: Path, place: Path) -> bool:
    """Whether ``path`` is ``place`` or lies under it (both real, absolute paths)."""
    return path == place or place in path.parents
