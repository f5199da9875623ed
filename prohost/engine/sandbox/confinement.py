"""A run's rules made ready to apply at its spawn: :func:`prepare` → :class:`Confinement`.

What "read everything except the hidden places" grants (Landlock can only grant):
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

import os
import threading
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Protocol, TypeVar

import attrs

from prohost.engine.sandbox import landlock, seatbelt
from prohost.engine.sandbox.policy import Policy, real_pairs
from prohost.engine.sandbox.probe import SANDBOX_EXEC, Support
from prohost.engine.sandbox.spawner import WAIT_S, Deliver, Spawner
from prohost.engine.sandbox.watch import Watch

T = TypeVar("T")


class Stamped(Protocol):
    """What a confinement was made from (``cache.Stamp``, named by its shape here:
    the cache imports this module)."""

    def holds(self) -> bool:
        """Whether the same policy would be given the same rules now."""

    def watch(self) -> Watch | None:
        """A watch on what the rules depend on, begun now and checked (or ``None``)."""


@attrs.define
class Confinement:
    """What a spawn needs to start its process confined; close it after the spawn.

    Prefix the command with ``argv_prefix`` (macOS), and on Linux either pass
    ``preexec`` as ``preexec_fn``, or — cheaper, and no code in the child — make the
    spawn inside :meth:`spawn_from_a_confined_thread`. A ``preexec_fn`` makes
    subprocess fork instead of vfork, and a fork's cost grows with the parent's size
    (``scripts/bench_sandbox.py``: about +2 ms over a 0.8 ms spawn for a small
    process, +7.5 ms with 150 MiB held; the thread adds about 0.4 ms, whatever the
    size). Neither passes the ruleset's descriptor to the child: the preexec runs
    before subprocess closes the child's descriptors, and the thread's domain needs
    no descriptor at all, so the ruleset never reaches the program.
    """

    argv_prefix: tuple[str, ...] = ()
    preexec: Callable[[], None] | None = None
    confined: bool = False
    _ruleset: landlock.Ruleset | None = None
    #: What its rules were made from, when the rule cache made them (``cache.Stamp``).
    stamp: Stamped | None = None
    _spawner: Spawner | None = None
    _watch: Watch | None = None

    def watch_for_changes(self) -> bool:
        """Begin watching what its rules were made from (:mod:`.watch`), so that
        :meth:`unchanged` can later say, without a syscall that could block, whether
        they are still right. ``False`` when that cannot be (no stamp, a network
        filesystem, out of date already). Blocking: call it in a worker thread."""
        if self._ruleset is None or self.stamp is None or self._watch is not None:
            return False
        self._watch = self.stamp.watch()
        return self._watch is not None

    def unchanged(self) -> bool | None:
        """Whether its rules are still right, as its watch says (``None``: it has
        none; then ask :meth:`still_right`). Never blocks: it reads the events the
        kernel has queued."""
        if self._watch is None or self._ruleset is None:
            return None
        return self._watch.quiet()

    def ready_spawner(self, *, first_wait_s: float | None = WAIT_S) -> None:
        """Start the thread its next spawn will be made from (:mod:`.spawner`): it
        enters the domain now, while the caller has other things to wait for, so
        that :meth:`spawn_soon` costs the spawn no thread of its own. It waits
        ``first_wait_s`` for its first job (``None``: until closed, for one made
        ahead). Nothing where it confines by a ruleset of its own (seatbelt,
        unconfined). Never blocks."""
        if self._ruleset is not None and self._spawner is None:
            self._spawner = Spawner(self._ruleset.fd, first_wait_s=first_wait_s)

    def check_soon(self, deliver: Deliver) -> bool:
        """Have the readied thread tell whether this confinement is still right
        (:meth:`still_right`, whose ``stat`` calls its domain does not restrict)
        and ``deliver`` the answer, from that thread; it then waits for the spawn.
        ``False`` when there is no such thread free. Never blocks."""
        return self._spawner is not None and self._spawner.give(self.still_right, deliver,
                                                                last=False)

    def spawn_soon(self, start: Callable[[], T], deliver: Deliver) -> bool:
        """Have the readied thread (:meth:`ready_spawner`) call ``start()`` and
        ``deliver`` its outcome, from that thread (an ``OSError`` without ``start``
        called when the domain could not be entered). ``False`` when there is no
        such thread (none readied, used, or ended unused): then spawn with
        :meth:`spawn_from_a_confined_thread`. Never blocks."""
        return self._spawner is not None and self._spawner.give(start, deliver)

    def still_right(self) -> bool:
        """Whether its rules are exactly those a preparation of the same policy
        would make now (nothing they were made from has changed since); ``False``
        when that cannot be told (made without the cache) or it is closed.
        Blocking: call it in a worker thread."""
        return self._ruleset is not None and self.stamp is not None and self.stamp.holds()

    def spawn_from_a_confined_thread(self, start: Callable[[], T]) -> T:
        """``start()`` (a spawn, e.g. ``subprocess.Popen(...)`` without ``preexec``)
        called on a fresh thread that has entered the domain first; its result.

        The alternative to ``preexec`` that runs no code in the child: subprocess
        keeps its vfork path (a preexec forces a full fork), and nothing but C runs
        between fork and exec. Only that thread is confined, and it ends with the
        call. Blocking (it joins the thread): call it in a worker thread. Raises
        what ``start`` raises, or ``OSError`` when the domain cannot be entered (then
        ``start`` is never called). Unconfined or seatbelt: ``start()`` is called
        here (the seatbelt's ``argv_prefix`` is still the caller's to add).
        """
        if self._ruleset is None:
            return start()
        fd = self._ruleset.fd
        result: list[T] = []
        failure: list[BaseException] = []

        def confined() -> None:
            try:
                landlock.restrict_this_thread(fd)
                result.append(start())
            except BaseException as error:  # handed to the caller's thread below
                failure.append(error)

        thread = threading.Thread(target=confined, name="prohost-confined-spawn")
        thread.start()
        thread.join()
        if failure:
            raise failure[0]
        return result[0]

    def close(self) -> None:
        """Release the ruleset (after the last spawn that uses this confinement), and
        end and join its readied thread (within a second: it is waiting, or done)."""
        if self._spawner is not None:
            self._spawner.close()
            self._spawner = None
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        if self._ruleset is not None:
            self._ruleset.close()
            self._ruleset = None

    def __enter__(self) -> Confinement:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


def prepare(policy: Policy, support: Support) -> Confinement:
    """The confinement for ``policy`` on this machine (unconfined where ``support`` is none).

    Blocking filesystem work (it resolves every path, lists the folders on the way
    to each hidden place, and on Linux opens each granted path and adds its rule):
    call it through ``trio.to_thread.run_sync``. The result holds a descriptor until
    :meth:`Confinement.close`. With ``support.rules`` (Landlock), what runs have
    in common is kept there and reused while it is still right (:mod:`.cache`):
    the same rules, made in a fraction of the time.
    """
    if support.kind == "landlock" and support.rules is not None:
        kept: Confinement = support.rules.prepare(policy, support)
        return kept
    return prepare_anew(policy, support)


def prepare_anew(policy: Policy, support: Support) -> Confinement:
    """:func:`prepare` without a cache: everything resolved, listed and opened now."""
    if support.kind is None:
        return Confinement()
    if support.kind == "seatbelt":
        return Confinement(argv_prefix=(SANDBOX_EXEC, "-p", seatbelt.profile(policy.resolved())),
                           confined=True)
    places = Places.of(policy)
    abi = landlock.abi_version()
    ruleset = landlock.Ruleset(abi)
    try:
        for path, rights in places.rules(complement(places.hidden), write=ruleset.handled):
            ruleset.allow(path, rights)
    except BaseException:
        ruleset.close()
        raise
    return Confinement(preexec=landlock.child_step(ruleset.fd), confined=True,
                       ruleset=ruleset)


@attrs.frozen
class Places:
    """A policy's places made real, as both preparations make a run's Landlock
    rules from them: :func:`prepare_anew` and the rule cache (:mod:`.cache`) share
    this resolution and :meth:`rules`, so they cannot grant one policy differently.

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
    lists, and what it keeps of each one's entries (the cache lists them one by
    one: :mod:`.cache`)."""

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
