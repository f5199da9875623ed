"""What a confined run may write, may read, and may not see: :class:`Policy`.

A policy names paths as the caller has them; :meth:`Policy.resolved` turns them into
real paths once, so a symbolic link never widens a grant (a link to ``~/.ssh`` is
hidden as ``~/.ssh`` is, because the rules are made on where it leads).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import attrs


def _path(value: Path | str) -> Path:
    # A Path is kept (immutable): parsing it again was most of a policy's making.
    return value if isinstance(value, Path) else Path(value)


def _paths(values: tuple[Path | str, ...] | list[Path | str]) -> tuple[Path, ...]:
    return tuple(map(_path, values))


def _triples(values: tuple[tuple[Path | str, Path | str, Path | str], ...]
             | list[tuple[Path | str, Path | str, Path | str]]
             ) -> tuple[tuple[Path, Path, Path], ...]:
    return tuple((_path(lower), _path(upper), _path(work)) for lower, upper, work in values)


def _pairs(values: tuple[tuple[Path | str, Path | str], ...] | list[tuple[Path | str, Path | str]]
           ) -> tuple[tuple[Path, Path], ...]:
    return tuple((_path(source), _path(target)) for source, target in values)


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

    ``shown``: read and execute, each whole hierarchy, only where no hidden place
    holds it (made real first: a link into a hidden place shows nothing): the
    files the person's ``--exec`` line names. Everything outside the hidden places
    is readable anyway; this matters only where a confinement's view empties a
    folder (bubblewrap's ``/tmp`` and ``/run``), and is decided there, on the
    hidden places it has resolved already.

    ``mounts``: (source, target) pairs, each a folder of the harness's own (its CLI
    folder, its caches) that the run sees, writable, at ``target`` (``~/.cache``,
    say) in place of what is there. Where the confinement has a mount namespace
    (bubblewrap) the source is bound at the target after the hidden places are
    emptied, so a target inside a hidden place is seen too; where it has none
    (Landlock alone) only the source is granted writable and the target stays as
    it is. A pair whose source does not exist is dropped.

    ``overlays``: (lower, upper, work) triples, each a folder of the person's
    (``lower``: an ACP agent's settings) that the run sees at its own path through
    an overlay whose writes land in ``upper``, a folder of the harness's: the
    person's settings and login are seen, nothing the run writes reaches them.
    ``work`` is the overlay's work folder (on ``upper``'s filesystem, seen by no
    run, one per confinement: two mounts must not share one). Where the
    confinement has a mount namespace (bubblewrap) the overlay is mounted with the
    other mounts, so a hidden place inside ``lower`` stays hidden; where it has
    none (Landlock alone) only ``upper`` is granted writable and ``lower`` stays as
    it is (read-only). A triple whose folders do not all exist is dropped. The
    caller refuses a ``lower`` that is a link or lies in a hidden place: an
    overlay inside a hidden place would uncover what is under it.
    """

    writable: tuple[Path, ...] = attrs.field(default=(), converter=_paths)
    readable: tuple[Path, ...] = attrs.field(default=(), converter=_paths)
    hidden: tuple[Path, ...] = attrs.field(default=(), converter=_paths)
    shown: tuple[Path, ...] = attrs.field(default=(), converter=_paths)
    mounts: tuple[tuple[Path, Path], ...] = attrs.field(default=(), converter=_pairs)
    overlays: tuple[tuple[Path, Path, Path], ...] = attrs.field(default=(), converter=_triples)

    def resolved(self) -> Policy:
        """The same policy on real paths (absolute, links followed), each once.

        Grants that do not exist are dropped; hidden places are kept even when
        missing (see the class). Blocking: it reads the filesystem.
        """
        return Policy(
            writable=_existing(_real(self.writable)),
            readable=_existing(_real(self.readable)),
            hidden=_real(self.hidden),
            shown=_existing(_real(self.shown)),
            mounts=tuple((Path(os.path.realpath(source)), Path(os.path.realpath(target)))
                         for source, target in self.mounts if os.path.isdir(source)),
            overlays=tuple(
                (Path(os.path.realpath(lower)), Path(os.path.realpath(upper)),
                 Path(os.path.realpath(work)))
                for lower, upper, work in self.overlays
                if all(os.path.isdir(folder) for folder in (lower, upper, work))),
        )


def _real(paths: tuple[Path, ...]) -> tuple[Path, ...]:
    return tuple(Path(path) for path in real_paths(paths))


def real_paths(paths: tuple[Path, ...] | list[str]) -> list[str]:
    """Each of ``paths`` made real as ``os.path.realpath(os.path.abspath(...))``
    does it, each once, in order. Blocking.

    One memo for them all: a policy's ~40 paths share most of their folders
    (``/``, ``/home``, ``~``…), which ``os.path.realpath`` would lstat again for
    each path (most of what resolving a run's policy cost, issue 29).
    """
    return list(dict.fromkeys(real for _, real in real_pairs(paths)))


def real_pairs(paths: tuple[Path, ...] | list[str], looked_up: set[str] | None = None
               ) -> list[tuple[str, str]]:
    """Each of ``paths`` (absolute, as a string) with its real path, in order, one
    memo for them all (as :func:`real_paths`, which keeps only the real ones, each
    once). ``looked_up`` gets every entry the resolution looked up, each as the
    real folder it is in plus its name: what the answers depend on (a change of any
    other entry leaves them as they are; ``None`` when a loop of links made one
    fall back to ``os.path.realpath``). Blocking."""
    memo: dict[str, str] = {"/": "/"}
    stepped: set[str] = set()
    pairs: list[tuple[str, str]] = []
    loop = False
    for path in paths:
        absolute = os.path.abspath(path)
        try:
            real = _resolve(absolute, memo, stepped)
        except _Loop:
            real = os.path.realpath(absolute)  # its own answer for a loop of links
            loop = True
        pairs.append((absolute, real))
    if looked_up is not None:
        looked_up.update(stepped)
        if loop:
            looked_up.add(UNKNOWN)
    return pairs


#: In ``looked_up``: a loop of links was met, so what the answers depend on is not known.
UNKNOWN = "\0"


class _Loop(Exception):
    pass


#: As many links as a path may go through (the kernel's own limit).
_MAX_LINKS = 40


def _resolve(absolute: str, memo: dict[str, str], stepped: set[str]) -> str:
    """``absolute`` (normalized: no ``.``, ``..`` or doubled ``/``) made real."""
    known = memo.get(absolute)
    if known is not None:
        return known
    parent, _, name = absolute.rpartition("/")
    real = _resolve(parent or "/", memo, stepped)
    known = _step(real, real + name if real == "/" else real + "/" + name, memo, 0, stepped)
    memo[absolute] = known
    return known


def _walk(real: str, rest: str, memo: dict[str, str], links: int, stepped: set[str]) -> str:
    """``rest`` (a link's target) resolved from the real folder ``real``, as
    ``os.path.realpath`` (not strict) does: a component that cannot be lstat'ed is
    taken as it is, ``..`` goes to the parent of what is resolved so far."""
    for name in rest.split("/"):
        if not name or name == ".":
            continue
        if name == "..":
            real = os.path.dirname(real)
            continue
        real = _step(real, os.path.join(real, name), memo, links, stepped)
    return real


def _step(real: str, candidate: str, memo: dict[str, str], links: int,
          stepped: set[str]) -> str:
    """``candidate`` (an entry of the real folder ``real``) made real."""
    known = memo.get(candidate)
    if known is not None:
        return known
    stepped.add(candidate)
    try:
        mode = os.lstat(candidate).st_mode
    except OSError:
        known = candidate
    else:
        if not stat.S_ISLNK(mode):
            known = candidate
        elif links >= _MAX_LINKS:
            raise _Loop
        else:
            target = os.readlink(candidate)
            known = _walk("/" if target.startswith("/") else real, target, memo, links + 1,
                          stepped)
    memo[candidate] = known
    return known


def _existing(paths: tuple[Path, ...]) -> tuple[Path, ...]:
    return tuple(path for path in paths if os.path.lexists(path))


def is_within(path: Path, place: Path) -> bool:
    """Whether ``path`` is ``place`` or lies under it (both real, absolute paths)."""
    return path == place or place in path.parents
