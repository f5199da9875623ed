"""The seccomp filter that keeps a confined run off Unix sockets: :func:`program`.

bubblewrap's read-only view does not stop ``connect()``: a socket the person keeps in
a readable place (Docker Desktop's ``~/.docker/run/docker.sock``, an editor's or a
tmux server's socket in a folder of the home) is reachable from a run by its path
(docs/protocol.md §13, issue 36 attack 6). So a run may not *make* a Unix socket:
``socket(AF_UNIX, …)`` fails with ``EPERM``, while ``socketpair`` (unnamed pairs:
pipes between a run's own processes, Node's and Python's subprocess plumbing) and
every other family (the network is not confined) stay allowed.

The rule is the one of Anthropic's sandbox runtime (Claude Code's ``srt``),
github.com/anthropic-experimental/sandbox-runtime at d35b813,
``vendor/seccomp-src/seccomp-unix-block.c``::

    seccomp_init(SCMP_ACT_ALLOW);
    seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(socket), 1,
                     SCMP_A0(SCMP_CMP_EQ, AF_UNIX));

exported with ``seccomp_export_bpf`` and handed to bubblewrap. Where this program
differs from the one libseccomp made there (its ``vendor/seccomp/x64/unix-block.bpf``),
each difference closes a way around it:

- only the low 32 bits of the family are compared: the kernel takes it as an
  ``int``, so ``socket(0x100000001, …)`` makes a Unix socket, while libseccomp's
  64-bit comparison lets it through;
- ``io_uring_setup`` fails with ``EPERM``: an io_uring's ``IORING_OP_SOCKET``
  (Linux 5.19) makes a socket with no ``socket()`` call a filter could see (as
  Docker's default profile, it is refused; libuv and others fall back to threads);
- the compat system calls are covered rather than killed: on x86_64, i386's
  (``int 0x80``: ``socket`` 359; ``socketcall`` 102 refused whole, as its
  arguments are in memory a filter cannot read) and x32's (the same numbers as
  x86_64 with bit 30 set); on aarch64, 32-bit ARM's (``socket`` 281, ``socketcall``
  102). Any other architecture in a call is killed (none can occur there).

The program is made here, in Python, for the machine's architecture; on any other
(``None``) a run gets no filter, and :mod:`.probe` says that point of §13 does not
hold. bubblewrap installs it for a run (``--seccomp FD``: :func:`readable`), and
for the harness's own confined git; where runs are confined by Landlock alone, the
thread that spawns the run installs it on itself (:class:`ThreadFilter`), as it
enters the Landlock domain, and the run inherits it.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import os
import platform
import struct

#: ``struct seccomp_data``: ``nr`` at 0, ``arch`` at 4, ``args[0]`` at 16 (its low
#: 32 bits there: both architectures are little-endian).
_NR, _ARCH, _ARG0_LOW = 0, 4, 16

#: ``AUDIT_ARCH_*``: the value of ``arch`` for each calling convention.
AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_I386 = 0x40000003
AUDIT_ARCH_AARCH64 = 0xC00000B7
AUDIT_ARCH_ARM = 0x40000028
#: x32's system calls are x86_64's with this bit set (``__X32_SYSCALL_BIT``).
X32_SYSCALL_BIT = 0x40000000

AF_UNIX = 1
#: ``io_uring_setup``: the same number on every architecture (added after 5.1's
#: unified numbering).
_IO_URING_SETUP = 425

#: BPF: ``ld [k]`` (word, absolute), ``and #k``, ``jeq #k``, ``ret #k``.
_LD_ABS, _AND, _JEQ, _RET = 0x20, 0x54, 0x15, 0x06
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_KILL_PROCESS = 0x80000000


class _Arch:
    """One calling convention's numbers: ``socket``, what is refused whole, and a
    mask applied to the number first (x86_64: without the x32 bit)."""

    def __init__(self, audit: int, socket: int, refused: tuple[int, ...],
                 mask: int | None = None) -> None:
        self.audit, self.socket, self.refused, self.mask = audit, socket, refused, mask


#: Each machine's native convention, then its compat one.
_MACHINES: dict[str, tuple[_Arch, _Arch]] = {
    "x86_64": (_Arch(AUDIT_ARCH_X86_64, 41, (_IO_URING_SETUP,), mask=~X32_SYSCALL_BIT),
               _Arch(AUDIT_ARCH_I386, 359, (102, _IO_URING_SETUP))),
    "aarch64": (_Arch(AUDIT_ARCH_AARCH64, 198, (_IO_URING_SETUP,)),
                _Arch(AUDIT_ARCH_ARM, 281, (102, _IO_URING_SETUP))),
}
_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}


def machine() -> str:
    """This machine's architecture as the kernel says it (``uname -m``)."""
    name = platform.machine().lower()
    return _ALIASES.get(name, name)


def program(arch: str | None = None) -> bytes | None:
    """The filter for ``arch`` (default: this machine's) as bubblewrap's
    ``--seccomp`` reads it (``struct sock_filter`` after ``struct sock_filter``,
    native byte order), or ``None`` for an architecture it has no numbers for."""
    conventions = _MACHINES.get(arch or machine())
    if conventions is None:
        return None
    deny = SECCOMP_RET_ERRNO | errno.EPERM
    # Assembled with labels: each jump names where it goes; offsets come after.
    code: list[tuple[int, int | str, str | None, str | None]] = []

    def op(code_: int, k: int | str = 0, true: str | None = None,
           false: str | None = None) -> None:
        code.append((code_, k, true, false))

    labels: dict[str, int] = {}

    def label(name: str) -> None:
        labels[name] = len(code)

    native, compat = conventions
    op(_LD_ABS, _ARCH)
    op(_JEQ, native.audit, "native", None)
    op(_JEQ, compat.audit, "compat", "kill")
    for name, convention in (("native", native), ("compat", compat)):
        label(name)
        op(_LD_ABS, _NR)
        if convention.mask is not None:
            op(_AND, convention.mask & 0xFFFFFFFF)
        op(_JEQ, convention.socket, "family", None)
        for number in convention.refused:
            op(_JEQ, number, "deny", None)
        op(_RET, SECCOMP_RET_ALLOW)
    label("family")
    op(_LD_ABS, _ARG0_LOW)
    op(_JEQ, AF_UNIX, "deny", "allow")
    label("deny")
    op(_RET, deny)
    label("allow")
    op(_RET, SECCOMP_RET_ALLOW)
    label("kill")
    op(_RET, SECCOMP_RET_KILL_PROCESS)

    found = bytearray()
    for index, (code_, k, true, false) in enumerate(code):
        # A jump is relative to the next instruction; no label means "fall through".
        jt = labels[true] - index - 1 if true else 0
        jf = labels[false] - index - 1 if false else 0
        found += struct.pack("=HBBI", code_, jt, jf, k)
    return bytes(found)


def readable(data: bytes) -> int:
    """A descriptor to read ``data`` from: a sealed memory file (nothing can change
    it, not even a process it is passed to). bubblewrap reads ``--seccomp``'s
    descriptor from its offset to its end, and that offset is shared with every
    process it is passed to: call :func:`rewind` before each spawn that passes it.
    Not inherited unless passed (``pass_fds``); the caller closes it."""
    fd = os.memfd_create("prohost-seccomp", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.write(fd, data)  # a few hundred bytes: written whole
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK
                    | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE)
        rewind(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def filter_fd() -> int | None:
    """A new descriptor (:func:`readable`) of this machine's :func:`program`, for
    one bubblewrap to read (``--seccomp``): the harness's own confined commands
    (:func:`.bwrap.confined_command`), each its own, so no two share an offset.
    ``None`` where there is no program for the architecture. The caller passes it
    to the spawn and then closes it."""
    data = program()
    return None if data is None else readable(data)


def rewind(fd: int) -> None:
    """Make the next read of ``fd`` (:func:`readable`) start at the program's start."""
    os.lseek(fd, 0, os.SEEK_SET)


#: ``prctl`` options: ``PR_SET_NO_NEW_PRIVS``, ``PR_SET_SECCOMP`` (mode 2: a filter).
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2


class _SockFprog(ctypes.Structure):
    """``struct sock_fprog``: the number of instructions, and where they are."""

    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_libc = ctypes.CDLL(None, use_errno=True)
_prctl = _libc.prctl
_prctl.restype = ctypes.c_int
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                   ctypes.c_ulong]


class ThreadFilter:
    """:func:`program` made ready to install on a thread (:meth:`install`): what
    bubblewrap's ``--seccomp`` does for its child, done by the thread that then
    spawns a run confined by Landlock alone, so the run and everything it starts
    inherit it. The filter belongs to that thread alone (no ``TSYNC``): the rest of
    the harness is unaffected, and the thread ends with its spawn."""

    def __init__(self, data: bytes) -> None:
        # Kept alive with the object: the kernel copies the program at install.
        self._code = ctypes.create_string_buffer(data, len(data))
        self._fprog = _SockFprog(len(data) // 8, ctypes.addressof(self._code))

    def install(self) -> None:
        """Install the filter on the calling thread, for good (``no_new_privs``
        first, which an unprivileged filter demands). ``OSError`` when the
        kernel refuses: the caller then spawns nothing."""
        for option, value in ((_PR_SET_NO_NEW_PRIVS, 1),
                              (_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER)):
            address = ctypes.addressof(self._fprog) if option == _PR_SET_SECCOMP else 0
            if _prctl(option, value, address, 0, 0) != 0:
                code = ctypes.get_errno()
                raise OSError(code, f"seccomp filter: {os.strerror(code)}")


@functools.cache
def thread_filter() -> ThreadFilter | None:
    """This machine's :func:`program` as a :class:`ThreadFilter`, made once (it is
    never changed); ``None`` where there is no program for the architecture."""
    data = program()
    return None if data is None else ThreadFilter(data)
