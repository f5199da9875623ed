"""What stays the same from one run's rules to the next, kept: :class:`RuleCache`.

A run's rules are nearly the same for every run (issue 29): the complement walk
(see :mod:`.confinement`) lists the same folders, and most grants are the same
paths; only the run's own places differ. :meth:`RuleCache.prepare` makes exactly
the rules :func:`~.confinement.prepare_anew` makes, but keeps, for the harness's
lifetime:

- **the walk's result**, folder by folder, with each listed folder's ``lstat``
  taken just before it was listed. A later run stats those folders again (one
  ``lstat`` each, about a dozen) and lists again only those that changed (device,
  inode, mode, mtime or ctime): a busy ``/tmp`` costs its own listing, not the
  home's. That is enough because what a folder adds to the result depends only on
  which entries it holds and on whether each is a link: adding, removing or
  renaming an entry (a new ``~/notes.txt``, a ``~/.ssh`` made later, a link
  retargeted, which is a removal and a creation) changes its folder's mtime and
  ctime, and a change of the folder's permissions (a listing that failed, or now
  would) changes its ctime. The hidden places themselves are resolved again for
  every run (a link to one, retargeted, changes the key). A folder's times come
  from a coarse clock, so a change within the same tick as the last one leaves
  them equal: a folder changed less than :data:`RECENT_NS` before it was listed
  is not trusted, and is listed again next time (git's "racily clean").
- **the open ``O_PATH`` descriptors** of the granted paths, so a run adds its
  rules without opening anything it already has. A descriptor of an entry of a
  folder not listed again still names what that entry names (the folder is
  unchanged); any other (the run's own places, the caches, an entry of a folder
  listed again) is checked with
  one ``lstat`` against the descriptor's device and inode (which cannot be reused
  while it is held open) and opened again when it differs. Descriptors no run
  asked for in the last preparation are closed, so they are bounded by one run's
  grants, and by :data:`MAX_HELD` (and a quarter of ``RLIMIT_NOFILE``) in all;
  :meth:`RuleCache.close` closes them all.

What it relies on: a filesystem that updates a folder's times when its entries
change (POSIX asks it; local filesystems, tmpfs and overlayfs do) and whose clock
is the machine's (within :data:`RECENT_NS`). A filesystem mounted *on* a granted
entry after it was opened is not seen: the rule stays on the folder it covers, so
that run reads less, never more (a listing of its folder made again sees it).

One lock: preparations wait for each other (each is about a millisecond). One that
cannot have it within :data:`LOCK_WAIT_S` (another stuck on a hung filesystem) is
made uncached instead, as before. No thread of its own.
"""

from __future__ import annotations

import os
import resource
import stat
import threading
import time

import attrs

from prohost.engine.sandbox import landlock
from prohost.engine.sandbox.confinement import Confinement, Places, Walk, prepare_anew
from prohost.engine.sandbox.policy import UNKNOWN, Policy, real_paths
from prohost.engine.sandbox.probe import Support
from prohost.engine.sandbox.watch import Watch, is_local

#: A folder changed less than this before it was listed is listed again next time
#: (its times' clock is coarse: a second change in the same tick would not show).
RECENT_NS = 2_000_000_000
#: Most descriptors held at once, and at most a quarter of the process's limit
#: (``RLIMIT_NOFILE``'s soft one: often 1,024, shared with 16 agents' pipes and the
#: sockets); past it a grant's descriptor is opened for the run and closed after
#: it, as without the cache.
MAX_HELD = 1024
#: How long a preparation waits for another before it is made uncached.
LOCK_WAIT_S = 1.0
#: Walks kept (one per set of hidden places: a harness has one).
MAX_WALKS = 4

_Signature = tuple[int, int, int, int, int] | None


@attrs.define
class _Listed:
    """What the walk granted of one folder's entries, and how the folder looked."""

    granted: list[str]
    signature: _Signature
    #: It had changed just before it was listed: to be listed again next time.
    recent: bool


@attrs.define
class _Kept:
    """One set of hidden places' walk: its plan, and each folder as last listed."""

    walk: Walk
    listed: dict[str, _Listed] = attrs.field(factory=dict)


@attrs.define
class _Held:
    fd: int
    device: int
    inode: int
    directory: bool


def _signature(folder: str) -> _Signature:
    try:
        found = os.lstat(folder)
    except OSError:
        return None  # gone or unreachable: its parent's times say when that changes
    return (found.st_dev, found.st_ino, found.st_mode, found.st_mtime_ns, found.st_ctime_ns)


class RuleCache:
    """The harness's cache of run rules, given to :func:`~.confinement.prepare`
    as ``Support.rules``; :meth:`close` it at exit."""

    def __init__(self, max_held: int | None = None, recent_ns: int = RECENT_NS) -> None:
        if max_held is None:
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            max_held = MAX_HELD if soft == resource.RLIM_INFINITY else min(MAX_HELD, soft // 4)
        self._lock = threading.Lock()
        self._recent_ns = recent_ns
        self._walks: dict[tuple[str, ...], _Kept] = {}
        self._held: dict[str, _Held] = {}
        self._max_held = max_held
        self._abi: int | None = None
        self._closed = False
        #: Preparations that listed a folder again, and those that listed none
        #: (for the tests and the bench).
        self.walks_made = 0
        self.walks_reused = 0

    @property
    def held(self) -> int:
        """How many descriptors are held now."""
        return len(self._held)

    def prepare(self, policy: Policy, support: Support) -> Confinement:
        """What :func:`~.confinement.prepare_anew` returns for ``policy``, made from
        what is kept where it is still right. Blocking: call it in a worker thread.
        """
        if support.kind != "landlock" or not self._lock.acquire(timeout=LOCK_WAIT_S):
            return prepare_anew(policy, support)
        try:
            if self._closed:
                return prepare_anew(policy, support)
            return self._prepare(policy)
        finally:
            self._lock.release()
            # A close() that came while this held the lock left the closing here.
            if self._closed and self._lock.acquire(blocking=False):
                try:
                    self._release_all()
                finally:
                    self._lock.release()

    def close(self) -> None:
        """Close every descriptor held; later preparations are made uncached.

        Never waits: while a preparation holds them (one abandoned on a hung
        filesystem, say), that preparation closes them as it ends."""
        self._closed = True
        if self._lock.acquire(blocking=False):
            try:
                self._release_all()
            finally:
                self._lock.release()

    def _release_all(self) -> None:
        self._walks.clear()
        for held in self._held.values():
            os.close(held.fd)
        self._held.clear()

    def _prepare(self, policy: Policy) -> Confinement:
        # Resolved and granted as prepare_anew does (one Places for both): what is
        # kept only spares it listing and opening again.
        places = Places.of(policy)
        rest, folders = self._complement(places.hidden)
        if self._abi is None:
            self._abi = landlock.abi_version()  # the running kernel's: it does not change
        ruleset = landlock.Ruleset(self._abi)
        used: dict[str, tuple[int, int]] = {}
        opened: list[int] = []  # past MAX_HELD: closed after this preparation
        try:
            rules = places.rules([path for path, _ in rest], write=ruleset.handled)
            for index, (path, rights) in enumerate(rules):
                # Places.rules puts the walk's result first, in its order: only those
                # of its entries found in a folder not listed again are trusted (a
                # readable or writable place is checked, even one of those entries).
                trusted = index < len(rest) and rest[index][1]
                held = self._descriptor(path, trusted, opened)
                if held is not None:
                    used[path] = (held.device, held.inode)
                    ruleset.allow_opened(held.fd, directory=held.directory, rights=rights)
        except BaseException:
            ruleset.close()
            raise
        finally:
            for fd in opened:
                os.close(fd)
            for path in [path for path in self._held if path not in used]:
                os.close(self._held.pop(path).fd)
        stamp = None
        if folders is not None:
            looked_up = places.looked_up
            stamp = Stamp(hidden_given=tuple(str(place) for place in policy.hidden),
                          hidden=places.hidden, folders=folders,
                          places=tuple((given, used.get(real))
                                       for given, real in (*places.readable, *places.writable)),
                          looked_up=None if UNKNOWN in looked_up else tuple(sorted(looked_up)))
        return Confinement(preexec=landlock.child_step(ruleset.fd), confined=True,
                           ruleset=ruleset, stamp=stamp)

    def _complement(self, hidden: tuple[str, ...]
                    ) -> tuple[list[tuple[str, bool]], tuple[tuple[str, _Signature], ...] | None]:
        """The walk's result, each path with whether it is *trusted*: found in a
        folder unchanged since it was last listed (only changed ones are listed
        again: ``/tmp`` changing often does not cost the home's listing); and each
        listed folder with the signature its entries were granted from (``None``
        when one had changed just before it was listed: a :class:`Stamp` cannot
        vouch for it)."""
        if not hidden:
            return [("/", False)], ()
        kept = self._walks.get(hidden)
        if kept is None:
            if len(self._walks) >= MAX_WALKS:
                self._walks.clear()
            kept = self._walks[hidden] = _Kept(Walk.over(hidden))
        now = time.time_ns()
        granted: list[tuple[str, bool]] = []
        signatures: list[tuple[str, _Signature]] | None = []
        relisted = False
        for folder in kept.walk.folders:
            # Before the listing: a change during it shows next time.
            signature = _signature(folder)
            last = kept.listed.get(folder)
            if last is not None and not last.recent and last.signature == signature:
                granted += [(path, True) for path in last.granted]
            else:
                relisted = True
                recent = (signature is not None
                          and now - max(signature[3], signature[4]) < self._recent_ns)
                last = kept.listed[folder] = _Listed(kept.walk.entries(folder), signature,
                                                     recent)
                granted += [(path, False) for path in last.granted]
            if signatures is not None:
                signatures = None if last.recent else [*signatures, (folder, signature)]
        if relisted:
            self.walks_made += 1
        else:
            self.walks_reused += 1
        return granted, None if signatures is None else tuple(signatures)

    def _descriptor(self, path: str, trusted: bool, opened: list[int]) -> _Held | None:
        """An ``O_PATH`` descriptor of ``path`` as it is now (``None``: gone, or a link).

        ``trusted``: an entry of a folder not listed again, so a held one is still it."""
        held = self._held.get(path)
        if held is not None:
            if trusted:
                return held
            try:
                now = os.lstat(path)
            except OSError:
                now = None
            if (now is not None and not stat.S_ISLNK(now.st_mode)
                    and (now.st_dev, now.st_ino) == (held.device, held.inode)):
                return held
            os.close(self._held.pop(path).fd)
        # As Ruleset.allow: never through a link, and a path gone since it was
        # resolved gets no grant.
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            found = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        if stat.S_ISLNK(found.st_mode):
            os.close(fd)
            return None
        fresh = _Held(fd, found.st_dev, found.st_ino, stat.S_ISDIR(found.st_mode))
        if len(self._held) < self._max_held:
            self._held[path] = fresh
        else:
            opened.append(fd)
        return fresh


@attrs.frozen
class Stamp:
    """What a cached preparation was made from, to tell later, cheaply, whether the
    same policy would be given exactly the same rules now (:meth:`holds`): the
    harness makes a run's confinement ahead, while it is idle, and checks it at the
    run's start (``prohost.engine.run.spares``).

    It holds when the hidden places resolve as they did (so the walk's plan is the
    same), every folder the walk listed still has the signature its entries were
    granted from (so the same entries: see the module), and every readable and
    writable place given still names the very file or folder (device and inode)
    that was granted, or still names nothing where nothing was. The identities
    cannot be another object's by reuse of an inode number: the ruleset holds a
    reference to every object it grants (as the cache's descriptors do), so none
    of them is freed while the confinement lives.
    """

    #: The policy's hidden places as given, and as they resolved.
    hidden_given: tuple[str, ...]
    hidden: tuple[str, ...]
    #: Each folder the walk lists, with the signature its grants come from.
    folders: tuple[tuple[str, _Signature], ...]
    #: Each readable and writable place as given (absolute), with the device and
    #: inode of what was granted there (``None``: nothing was, it did not exist).
    places: tuple[tuple[str, tuple[int, int] | None], ...]
    #: Every entry resolving the places looked up (its real folder's path plus its
    #: name; ``None``: not known, a loop of links): what :meth:`watch` watches
    #: besides the listed folders.
    looked_up: tuple[str, ...] | None = None

    def watch(self) -> Watch | None:
        """A :class:`~.watch.Watch` on everything the rules depend on, begun now and
        checked after it began (so no change can fall between the check and the
        watch); ``None`` when that cannot be (a folder on a network filesystem, no
        inotify left, a loop of links) or the rules are out of date already.
        Blocking."""
        if self.looked_up is None:
            return None
        folders: dict[str, set[str] | None] = {}
        for folder, _signature_then in self.folders:
            folders[folder] = None
        for entry in self.looked_up:
            folder, _, name = entry.rpartition("/")
            named = folders.setdefault(folder or "/", set())
            if named is not None:
                named.add(name)
        # A missing folder needs no watch: its parent's (whole, or for its name)
        # sees it made.
        existing = {folder: names for folder, names in folders.items() if os.path.isdir(folder)}
        if not all(is_local(folder) for folder in existing):
            return None
        try:
            watch = Watch(existing)
        except OSError:
            return None
        if not self.holds():
            watch.close()
            return None
        return watch

    def holds(self) -> bool:
        """Whether the rules made then are still exactly right. Blocking: a few
        dozen ``stat`` calls, a fraction of a preparation."""
        for folder, signature in self.folders:
            if _signature(folder) != signature:
                return False
        for place, granted in self.places:
            try:
                found = os.stat(place)
            except OSError:
                now = None
            else:
                now = (found.st_dev, found.st_ino)
            if now != granted:
                return False
        return tuple(real_paths(list(self.hidden_given))) == self.hidden
