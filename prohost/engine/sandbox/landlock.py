"""Landlock over ``ctypes``: the ruleset is built in the parent, applied in the child.

Why not a PyPI package (checked 2026-12: ``landlock`` 1.0.0.dev5, ``landlockpy`` 0.2.0,
``py-landlock`` 0.1.1): all three are alpha/beta single-author projects, and all
three are built around "restrict *this* process" (``Ruleset.apply()`` calls
``prctl`` and ``restrict_self`` through their own Python objects). The harness
needs the other split: every rule added in the parent (blocking filesystem work,
in a worker thread), and in the forked child of a threaded parent only two
syscalls through function pointers resolved beforehand (see :func:`child_step`).
The three syscalls are a few lines over libc's ``syscall``, so a dependency would
add risk and no safety.

ABI coverage: the handled filesystem rights are masked to what the running ABI
knows (REFER from ABI 2, TRUNCATE from 3, IOCTL_DEV from 5); ABI 4's network
rights are not handled (the network is not confined, docs/protocol.md §13); ABI 6's
scopes are used where the ABI has them: a confined run can neither connect to an
abstract Unix socket nor signal a process outside its own domain (§13: the
person's sockets and processes); ABI 7's audit flags are not
used (the logging defaults are right). On ABI 1 a file cannot be moved or linked
into another folder (no REFER right exists to grant it): that fails with EXDEV.
"""

from __future__ import annotations

import ctypes
import os
import stat
from collections.abc import Callable

# Syscall numbers: the same on x86_64 and aarch64 (the generic table), and on
# every other architecture since Linux 5.13 added them in one block.
_CREATE_RULESET = 444
_ADD_RULE = 445
_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5

_ABI1 = (1 << 13) - 1
#: Rights that apply to a file (a rule on anything but a folder may hold only these).
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
#: A read grant: open and list, run programs.
READ = EXECUTE | READ_FILE | READ_DIR


def handled_rights(abi: int) -> int:
    """Every filesystem right ``abi`` knows: what a ruleset handles, and a write grant."""
    rights = _ABI1
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


#: ABI 6's scopes: abstract Unix sockets and signals outside the domain.
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1
SCOPES = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
#: The first ABI with scopes.
SCOPES_ABI = 6


class _RulesetAttr(ctypes.Structure):
    # Only the first field: the kernel takes the size we pass, so a ruleset that
    # handles no network rights and no scopes is valid on every ABI.
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


class _ScopedRulesetAttr(ctypes.Structure):
    # ABI 6's layout: no network rights are handled (the network is not confined).
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # the kernel's struct is __attribute__((packed))
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_prctl = _libc.prctl
_prctl.restype = ctypes.c_int
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                   ctypes.c_ulong]


def _check(result: int) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return result


def abi_version() -> int:
    """The running kernel's Landlock ABI (1…); ``OSError`` where it has none."""
    return _check(_syscall(ctypes.c_long(_CREATE_RULESET), None, ctypes.c_size_t(0),
                           ctypes.c_uint32(_CREATE_RULESET_VERSION)))


class Ruleset:
    """A Landlock ruleset being built: a file descriptor in this process.

    Blocking (it opens every path it is given): build it in a worker thread.
    """

    def __init__(self, abi: int, *, files: bool = True) -> None:
        """A ruleset for ``abi``: handling every filesystem right it knows (unless
        not ``files``: then it scopes only, and ``abi`` must have scopes), and
        scoping abstract Unix sockets and signals where ``abi`` can."""
        self.handled = handled_rights(abi) if files else 0
        attr: ctypes.Structure = (
            _ScopedRulesetAttr(self.handled, 0, SCOPES) if abi >= SCOPES_ABI
            else _RulesetAttr(self.handled))
        # Always O_CLOEXEC (the kernel sets it), so no other child inherits it.
        self.fd = _check(_syscall(ctypes.c_long(_CREATE_RULESET), ctypes.byref(attr),
                                  ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0)))

    def allow(self, path: str, rights: int) -> bool:
        """Grant ``rights`` beneath ``path`` (a real path); ``False`` when it is gone
        or has become a symbolic link since it was resolved (a race: skipped, so a
        link never carries a grant, and a removal never fails the run)."""
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW)
        except (FileNotFoundError, NotADirectoryError):
            return False
        try:
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode):
                return False
            self.allow_opened(fd, directory=stat.S_ISDIR(mode), rights=rights)
            return True
        finally:
            os.close(fd)

    def allow_opened(self, fd: int, *, directory: bool, rights: int) -> None:
        """Grant ``rights`` beneath what ``fd`` (an ``O_PATH`` descriptor of a file
        or folder, never a link) is; the caller keeps and closes ``fd``: the kernel
        holds its own reference to the object once the rule is added."""
        wanted = rights & self.handled
        if not directory:
            wanted &= _FILE_RIGHTS
        attr = _PathBeneathAttr(wanted, fd)
        _check(_syscall(ctypes.c_long(_ADD_RULE), ctypes.c_int(self.fd),
                        ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(attr),
                        ctypes.c_uint32(0)))

    def close(self) -> None:
        """Close the ruleset's descriptor (after every spawn that uses it)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def restrict_this_thread(ruleset_fd: int) -> None:
    """Enter the ruleset's domain in the calling thread only, for good.

    Both ``no_new_privs`` and a Landlock domain belong to one thread (a task) until
    it starts a process, which inherits them: so a fresh thread that calls this and
    then spawns gives a confined child with no code run in the child at all, and
    the rest of this process stays unconfined. Never call it on a thread that lives
    on doing other work (trio's worker threads are reused); the one that lives on
    to spawn bubblewrap's runs does nothing else (:mod:`.confinement`).
    ``OSError`` when the kernel refuses.
    """
    if _prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        _check(-1)
    _check(_syscall(ctypes.c_long(_RESTRICT_SELF), ctypes.c_int(ruleset_fd),
                    ctypes.c_uint32(0)))


class ChildStepFailed(Exception):
    """Raised in the child when confining it failed, so its ``exec`` never happens."""


def child_step(ruleset_fd: int) -> Callable[[], None]:
    """What the child runs between fork and exec to enter the ruleset's domain.

    subprocess's ``preexec_fn`` is unsafe in a threaded parent because the child is
    a copy of one thread of a process whose other threads may have held locks at the
    fork: code that takes one of those hangs forever. (Python itself takes the import
    lock and logging's locks around such a fork; any other lock, a library's or
    libc's, is the hazard.) This function takes none: everything it needs is
    resolved now, in the parent (the two ctypes function pointers, every argument
    as a prebuilt ctypes integer, the exception it raises), so in the child it only
    makes two foreign calls and compares their results. No import, no logging, no
    string formatting. Both calls affect only the calling process, and the domain is
    inherited by every process the child will ever start; it cannot be lifted.

    If either call fails the child raises: subprocess then reports
    ``SubprocessError("Exception occurred in preexec_fn.")`` in the parent and the
    program is never executed, so a run is never left unconfined by accident.
    """
    prctl, syscall = _prctl, _syscall
    no_new_privs = ctypes.c_int(_PR_SET_NO_NEW_PRIVS)
    one, zero = ctypes.c_ulong(1), ctypes.c_ulong(0)
    restrict = ctypes.c_long(_RESTRICT_SELF)
    fd, flags = ctypes.c_int(ruleset_fd), ctypes.c_uint32(0)
    failed = ChildStepFailed()

    def enter_domain() -> None:
        # restrict_self demands no_new_privs (or CAP_SYS_ADMIN): it keeps a setuid
        # program from running with rules its owner never chose.
        if prctl(no_new_privs, one, zero, zero, zero) != 0:
            raise failed
        if syscall(restrict, fd, flags) != 0:
            raise failed

    return enter_domain
