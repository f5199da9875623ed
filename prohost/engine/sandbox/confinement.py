"""A run's rules made ready to apply at its spawn: :func:`prepare` → :class:`Confinement`.

Where bubblewrap runs, a run's view is its options (:mod:`.bwrap`) and its Landlock
domain only scopes. The rest of this module is the fallback, Landlock's filesystem
rules alone. What "read everything except the hidden places" grants (Landlock can only grant):
with no hidden place, read and execute on ``/`` (everything). Otherwise, for every
folder on the way from ``/`` down to each hidden place (its *ancestors*), each entry
that is neither a hidden place nor itself such an ancestor gets read and execute on
its whole hierarchy; symbolic-link entries are skipped (a link gets no rule of its
own; what it leads to is granted or not by its real path, so a link to ``~/.ssh``
is as hidden as ``~/.ssh``). So, with ``~/.ssh`` hidden: ``/usr``, ``/etc``, ``~/src``
… are readable as wholes, now and later; the ancestors themselves (``/``, ``/home``,
``~``) cannot be listed (a read-dir right on one would cover the hidden place
beneath it: ``ls ~`` fails with EACCES while ``cat ~/src/x`` works); and a file or
folder created *later* directly in an ancestor (a new ``~/notes.txt`` after the run
started) is not readable by that run. Later runs compute their rules at their own
start and see it.
"""

from __future__ import annotations

import _thread
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import TypeVar

import attrs

from prohost.engine.sandbox import bwrap, landlock, seatbelt, seccomp
from prohost.engine.sandbox.policy import Policy, real_pairs
from prohost.engine.sandbox.probe import SANDBOX_EXEC, Support

T = TypeVar("T")


class ConfinementFailed(Exception):
    """A run's confinement could not be made: the agent is not started (never
    unconfined by accident). The message says why, naming no local path."""


@attrs.define
class Confinement:
    """What a spawn needs to start its process confined; close it after the spawn.

    Prefix the command with ``argv_prefix`` (bubblewrap and its options, or
    macOS's ``sandbox-exec``) and make the spawn inside :meth:`spawn`, which
    enters the Landlock domain (bubblewrap: its scopes alone; the fallback: the
    filesystem rules too) on a fresh thread first: the child and everything it
    starts inherit it, the harness does not, and no code runs in the child
    (``preexec`` would force ``fork`` over ``vfork``). With ``namespaced`` the
    command is bubblewrap's, which takes the working folder as ``--chdir``
    (:func:`prohost.engine.agent.spawn.command_line`).
    """

    argv_prefix: tuple[str, ...] = ()
    #: Every point of §13 holds (what the completion's ``confined`` says).
    confined: bool = False
    #: The command is bubblewrap's: the run's processes are in a PID namespace of
    #: their own, which ends with bubblewrap's init.
    namespaced: bool = False
    _ruleset: landlock.Ruleset | None = None
    #: The ruleset is the process's one scope-only ruleset (:func:`_scopes`): kept.
    _shared: bool = False
    #: Descriptors the spawn passes to the command (bubblewrap's seccomp filter,
    #: rewound before each spawn); closed by :meth:`close`.
    pass_fds: tuple[int, ...] = ()
    #: Landlock alone: the filter on Unix sockets the spawning thread installs on
    #: itself after entering the domain (bubblewrap installs its own).
    _socket_filter: seccomp.ThreadFilter | None = None

    @property
    def has_domain(self) -> bool:
        """:meth:`spawn` enters a Landlock domain first."""
        return self._ruleset is not None

    @property
    def preexec(self) -> Callable[[], None] | None:
        """The domain entered between fork and exec, for a caller that spawns
        without :meth:`spawn` (tests; a ``preexec`` forces a full fork). The
        filter on Unix sockets is not installed this way: :meth:`spawn` does it."""
        return landlock.child_step(self._ruleset.fd) if self._ruleset is not None else None

    def spawn_soon(self, start: Callable[[], T],
                   deliver: Callable[[T | None, BaseException | None], None]) -> None:
        """Have a fresh thread enter the domain, call ``start()`` and ``deliver``
        (from that thread) its result or what it raised (an ``OSError`` without
        ``start`` called when the domain could not be entered). Never blocks: the
        caller needs no worker thread of its own to wait in."""

        def confined() -> None:
            try:
                if self._ruleset is not None:
                    landlock.restrict_this_thread(fd)
                    self._filter_this_thread()
                self.rewind()
                result = start()
            except BaseException as error:  # handed to deliver: nobody joins this thread
                deliver(None, error)
            else:
                deliver(result, None)

        fd = self._ruleset.fd if self._ruleset is not None else -1
        # The low-level start: ``threading.Thread.start`` waits until the new thread
        # runs, which stalled the caller (trio's loop) for a scheduling round on a
        # busy machine; nobody joins this thread, so there is nothing to wait for.
        _thread.start_new_thread(confined, ())

    def spawn(self, start: Callable[[], T]) -> T:
        """``start()`` (a spawn, e.g. ``subprocess.Popen(...)`` without ``preexec``)
        called on a fresh thread that has entered the domain first; its result.

        Only that thread is confined, and it ends with the call. Blocking (it joins
        the thread): call it in a worker thread. Raises what ``start`` raises, or
        ``OSError`` when the domain cannot be entered (then ``start`` is never
        called). Without a domain, ``start()`` is called here.
        """
        if self._ruleset is None:
            self.rewind()
            return start()
        fd = self._ruleset.fd
        result: list[T] = []
        failure: list[BaseException] = []

        def confined() -> None:
            try:
                landlock.restrict_this_thread(fd)
                self._filter_this_thread()
                self.rewind()
                result.append(start())
            except BaseException as error:  # handed to the caller's thread below
                failure.append(error)

        thread = threading.Thread(target=confined, name="prohost-confined-spawn")
        thread.start()
        thread.join()
        if failure:
            raise failure[0]
        return result[0]

    def _filter_this_thread(self) -> None:
        # After the domain: both are this thread's alone, and it ends with the spawn.
        if self._socket_filter is not None:
            self._socket_filter.install()

    def rewind(self) -> None:
        """Have the next spawn's bubblewrap read what it is passed from the start
        (:meth:`spawn` and :meth:`spawn_soon` do; a spawn without them must)."""
        # Each spawn's bubblewrap reads the seccomp filter from its start (a
        # retry in the same attempt spawns again); spawns of one confinement
        # are one after another, never at once.
        for fd in self.pass_fds:
            seccomp.rewind(fd)

    def close(self) -> None:
        """Release the ruleset (after the last spawn that uses this confinement)."""
        if self._ruleset is not None and not self._shared:
            self._ruleset.close()
        self._ruleset = None
        for fd in self.pass_fds:
            os.close(fd)
        self.pass_fds = ()

    def __enter__(self) -> Confinement:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


def prepare(policy: Policy, support: Support) -> Confinement:
    """The confinement for ``policy`` on this machine (unconfined where ``support`` is
    none), made anew for each attempt, so nothing a run changed can carry a grant
    to the next one (bubblewrap's kept resolution of the hidden places is used
    only while every entry it looked up is unchanged: :mod:`.bwrap`). Under
    bubblewrap the run's ``/tmp`` is an empty tmpfs of its own, which is its
    ``TMPDIR`` too (the mount points made there for places under the person's
    ``/tmp`` never reach the disk either).

    Blocking filesystem work (it resolves every path; for the Landlock fallback it
    also lists the folders on the way to each hidden place and opens each grant):
    call it through ``trio.to_thread.run_sync``. The result holds a descriptor
    until :meth:`Confinement.close`.
    """
    if support.kind is None:
        return Confinement()
    if support.kind == "seatbelt":
        return Confinement(argv_prefix=(SANDBOX_EXEC, "-p", seatbelt.profile(policy.resolved())),
                           confined=True)
    if support.kind == "bwrap":
        program = seccomp.program() if support.socket_filter else None
        fd = seccomp.readable(program) if program is not None else None
        try:
            options = bwrap.arguments(policy, tmpdir=None, seccomp_fd=fd)
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise
        # With the socket filter the run makes no Unix socket at all (abstract ones
        # included) and its PID namespace names no process outside it: Landlock's
        # scopes would add nothing, and entering them costs a thread per spawn.
        return Confinement(argv_prefix=(support.bwrap, *options), confined=support.complete,
                           namespaced=True, ruleset=_scopes(support.abi) if fd is None else None,
                           shared=True, pass_fds=() if fd is None else (fd,))
    return prepare_landlock(policy, support)


#: The scope-only ruleset, made once: it names no path, so nothing a run changes
#: can make it stale, and making one cost about a quarter of a millisecond of CPU
#: per run (``scripts/bench_sandbox.py``). Its descriptor lives as long as the process.
_SCOPE_RULESET: list[landlock.Ruleset] = []
_SCOPE_LOCK = threading.Lock()


def _scopes(abi: int) -> landlock.Ruleset | None:
    """The process's scope-only ruleset (``None`` below ABI 6, which has no scopes)."""
    if abi < landlock.SCOPES_ABI:
        return None
    with _SCOPE_LOCK:
        if not _SCOPE_RULESET:
            _SCOPE_RULESET.append(landlock.Ruleset(abi, files=False))
        return _SCOPE_RULESET[0]


def prepare_landlock(policy: Policy, support: Support) -> Confinement:
    """The fallback: Landlock's filesystem rules (and scopes, from ABI 6), with the
    seccomp filter on Unix sockets (:class:`.seccomp.ThreadFilter`) unless
    ``support`` has it off.
    A mount's source, an overlay's upper folder, is granted writable; its target
    (the overlay's lower folder, the person's) stays as it is."""
    policy = attrs.evolve(policy, writable=(*policy.writable,
                                            *(source for source, _ in policy.mounts),
                                            *(upper for _, upper, _ in policy.overlays)))
    places = Places.of(policy)
    ruleset = landlock.Ruleset(support.abi or landlock.abi_version())
    try:
        for path, rights in places.rules(complement(places.hidden), write=ruleset.handled):
            ruleset.allow(path, rights)
    except BaseException:
        ruleset.close()
        raise
    # The filter that keeps the run off Unix sockets (by path: Landlock does not
    # stop connect; abstract ones too), as bubblewrap's runs get it.
    return Confinement(confined=support.complete, ruleset=ruleset,
                       socket_filter=seccomp.thread_filter() if support.socket_filter else None)


@attrs.frozen
class Places:
    """A policy's places made real, as the Landlock fallback makes a run's rules
    from them (:func:`prepare_landlock`).

    As :meth:`Policy.resolved`, on strings (pathlib's parsing was a third of a
    cached preparation), with one difference: a readable or writable place that
    does not exist is kept here, and gets no rule where it cannot be opened (a
    lookup that fails otherwise, a loop of links say, fails the preparation).
    """

    #: The hidden places, real, each once (kept even when missing: see Policy).
    hidden: tuple[str, ...]
    #: Each readable, then writable, place as given (absolute) with its real path.
    readable: tuple[tuple[str, str], ...]
    writable: tuple[tuple[str, str], ...]
    #: Every entry the resolution looked up (``policy.UNKNOWN`` among them when a
    #: loop of links was met): what the real paths depend on.
    looked_up: frozenset[str]

    @classmethod
    def of(cls, policy: Policy) -> Places:
        """``policy``'s places resolved now. Blocking: it reads the filesystem."""
        looked_up: set[str] = set()
        hidden = tuple(_once(real_pairs(policy.hidden, looked_up)))
        readable = tuple(real_pairs(policy.readable, looked_up))
        writable = tuple(real_pairs(policy.writable, looked_up))
        return cls(hidden, readable, writable, frozenset(looked_up))

    def rules(self, rest: Sequence[str], *, write: int) -> list[tuple[str, int]]:
        """Each path the ruleset grants, with its rights, in the order they are
        added: ``rest`` (the walk's result for :attr:`hidden`) first and in its
        order, read and execute; then each readable place, read and execute; then
        each writable one, ``write`` (every right the ruleset handles)."""
        found = [(path, landlock.READ) for path in rest]
        found += [(path, landlock.READ) for path in _once(self.readable)]
        found += [(path, write) for path in _once(self.writable)]
        return found


def _once(pairs: Iterable[tuple[str, str]]) -> list[str]:
    """The real paths of ``pairs``, each once, in order."""
    return list(dict.fromkeys(real for _, real in pairs))


def complement(hidden_places: Sequence[str]) -> list[str]:
    """The complement of the hidden places (real paths), as whole hierarchies (see
    the module). Plain strings: a run pays this walk at every spawn it is not cached
    for, and ``pathlib``'s comparisons made it ten times slower. Blocking."""
    if not hidden_places:
        return ["/"]
    walk = Walk.over(hidden_places)
    granted: list[str] = []
    for folder in walk.folders:
        granted += walk.entries(folder)
    return granted


@attrs.frozen
class Walk:
    """The complement walk's plan for a set of hidden places: which folders it
    lists, and what it keeps of each one's entries."""

    hidden: frozenset[str]
    #: Each hidden place with a trailing ``/``: what lies inside one.
    inside: tuple[str, ...]
    ancestors: frozenset[str]
    #: The folders listed, in order: the ancestors not inside a hidden place.
    folders: tuple[str, ...]

    @classmethod
    def over(cls, hidden_places: Sequence[str]) -> Walk:
        """The plan for ``hidden_places`` (real, absolute paths; not empty)."""
        hidden = frozenset(hidden_places)
        inside = tuple(place.rstrip("/") + "/" for place in hidden)
        ancestors: set[str] = set()
        for place in hidden_places:
            ancestors.update(_parents(place))
        # Nothing inside a hidden place is granted by the walk.
        folders = tuple(folder for folder in sorted(ancestors) if not folder.startswith(inside))
        return cls(hidden, inside, frozenset(ancestors), folders)

    def entries(self, folder: str) -> list[str]:
        """What the walk grants of ``folder``'s entries now. Blocking."""
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return []
        granted: list[str] = []
        hidden, ancestors, inside = self.hidden, self.ancestors, self.inside
        for entry in entries:
            path = entry.path
            if path in hidden or path in ancestors or path.startswith(inside):
                continue
            if entry.is_symlink():
                continue
            granted.append(path)
        return granted


def _parents(place: str) -> list[str]:
    """``Path(place).parents`` of a real, absolute path, as strings."""
    found = []
    while place != "/":
        place = place.rpartition("/")[0] or "/"
        found.append(place)
    return found
