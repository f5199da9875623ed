"""The seccomp filter that keeps a run off Unix sockets (docs/protocol.md §13, issue
36 attack 6): loaded by the kernel into a real child process, which then tries
each way to make a Unix socket, judged by the errors the kernel gives it; and the
points a machine without a filter reports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prohost.engine.sandbox import Policy, prepare, probe, seccomp

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or seccomp.program() is None,
    reason="the filter is Linux's, for x86_64 and aarch64")

#: A child that loads the filter in ``argv[1]`` (nothing for none) and says what
#: each attempt met: ``ok`` or the errno's name.
CHILD = r"""
import ctypes, errno, json, mmap, os, platform, socket, sys

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def load(path):
    data = open(path, "rb").read()
    buf = ctypes.create_string_buffer(data, len(data))
    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    prog = Prog(len(data) // 8, ctypes.addressof(buf))
    assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, FILTER
        raise OSError(ctypes.get_errno(), "seccomp")

def said(call):
    try:
        result = call()
    except OSError as error:
        return errno.errorcode[error.errno]
    if isinstance(result, socket.socket):
        result.close()
    elif isinstance(result, tuple):
        for each in result:
            each.close()
    return "ok"

def raw(number, *args):
    result = libc.syscall(ctypes.c_long(number), *map(ctypes.c_long, args))
    if result < 0:
        raise OSError(ctypes.get_errno(), "")
    os.close(result)

def i386_socket():
    # socket(AF_UNIX, SOCK_STREAM, 0) by int 0x80 (i386's convention, number 359)
    # from this 64-bit process: push rbx; mov eax,359; mov ebx,1; mov ecx,1;
    # xor edx,edx; int 0x80; pop rbx; ret.
    code = bytes.fromhex("53b867010000bb01000000b90100000031d2cd805bc3")
    area = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    area.write(code)
    address = ctypes.addressof(ctypes.c_char.from_buffer(area))
    result = ctypes.CFUNCTYPE(ctypes.c_int)(address)()
    if result < 0:
        raise OSError(-result, "")
    os.close(result)

if len(sys.argv) > 1:
    load(sys.argv[1])
found = {
    "unix": said(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)),
    "unix-dgram": said(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)),
    "pair": said(lambda: socket.socketpair(socket.AF_UNIX)),
    "inet": said(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM)),
    "inet6": said(lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)),
}
if platform.machine() == "x86_64":
    found["high-bits"] = said(lambda: raw(41, 0x100000001, 1, 0))
    found["x32"] = said(lambda: raw(0x40000000 | 41, 1, 1, 0))
    found["i386"] = said(i386_socket)
    found["io_uring"] = said(lambda: raw(425, 1, 0))
else:
    found["high-bits"] = said(lambda: raw(198, 0x100000001, 1, 0))
    found["io_uring"] = said(lambda: raw(425, 1, 0))
print(json.dumps(found))
"""


def attempts(tmp_path: Path, program: bytes | None) -> dict[str, str]:
    argv = [sys.executable, "-c", CHILD]
    if program is not None:
        (tmp_path / "filter.bpf").write_bytes(program)
        argv.append(str(tmp_path / "filter.bpf"))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    found: dict[str, str] = json.loads(done.stdout)
    return found


def test_a_unix_socket_cannot_be_made_any_way_while_pairs_and_the_network_can(
        tmp_path: Path) -> None:
    """Every way to make a Unix socket fails with ``EPERM``: ``socket()``, with the
    family's upper bits set (the kernel reads an ``int``), by x32's and i386's
    numbers, and through an io_uring (refused whole); ``socketpair`` and the
    internet families still work."""
    before = attempts(tmp_path, None)
    found = attempts(tmp_path, seccomp.program())
    assert before["unix"] == before["pair"] == before["high-bits"] == "ok"
    assert found["unix"] == found["unix-dgram"] == found["high-bits"] == "EPERM"
    assert found["pair"] == found["inet"] == found["inet6"] == "ok"
    assert found["io_uring"] == "EPERM"
    if seccomp.machine() == "x86_64":
        assert found["x32"] == "EPERM"
        if before["i386"] == "ENOSYS":
            pytest.skip("this kernel runs no i386 system calls (ia32 emulation is off)")
        assert before["i386"] == "ok"
        assert found["i386"] == "EPERM"


def test_an_unknown_architecture_gets_no_filter_and_the_probe_says_the_point_fails(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the filter has no numbers (riscv64, say), no run gets it, and the
    probe names the socket point among those that do not hold: completions say
    ``"confined": false``, ``required`` refuses."""
    assert probe().kind == "bwrap" or pytest.skip("no bubblewrap here")
    assert seccomp.program("riscv64") is None
    monkeypatch.setattr(seccomp, "machine", lambda: "riscv64")
    support = probe()
    assert not support.complete
    assert any("Unix sockets" in gap and "riscv64" in gap for gap in support.gaps)


def test_every_spawn_of_one_confinement_gets_the_filter(tmp_path: Path) -> None:
    """A retry in the same attempt spawns bubblewrap again with the same
    confinement: it reads the filter again from its start, and its agent too is
    refused a Unix socket."""
    support = probe()
    if support.kind != "bwrap":
        pytest.skip("bubblewrap cannot run here")
    look = ("import socket\ntry:\n    socket.socket(socket.AF_UNIX)\n    print('made')\n"
            "except OSError as error:\n    print(error.errno)")
    with prepare(Policy(), support) as confinement:
        said = [confinement.spawn(lambda: subprocess.run(
            [*confinement.argv_prefix, "--", sys.executable, "-c", look],
            pass_fds=confinement.pass_fds, capture_output=True, text=True, timeout=30,
            check=False)) for _ in range(2)]
    assert [(done.returncode, done.stdout.strip()) for done in said] == [(0, "1"), (0, "1")]
