"""Whether this machine can confine a run, and how: :func:`probe`."""

from __future__ import annotations

import os
import platform
import sys
from typing import Literal

import attrs

#: Only this copy: one earlier on PATH could be anyone's (as Codex reasons).
SANDBOX_EXEC = "/usr/bin/sandbox-exec"

#: What Landlock alone leaves open, each as the §13 point it fails (the seccomp
#: filter on Unix sockets, which the spawning thread installs, closes the rest).
LANDLOCK_GAPS = (
    "modes, owners, times and attributes outside the run's places can be changed",
    "processes outside the run are visible, and a run's processes can outlive it",
    "your terminals (/dev/pts) can be written",
)
#: Landlock alone, where :mod:`.seccomp` has no filter for the machine's architecture.
LANDLOCK_SOCKET_GAP = ("Unix sockets outside the run's places can be reached by path: no "
                       "seccomp filter for this machine's architecture (%s)")
#: Without Landlock's scopes (ABI 6), under bubblewrap.
SCOPE_GAP = ("abstract Unix sockets outside the run can be reached (Landlock ABI 6 is "
             "needed to scope them)")
#: Under bubblewrap, where :mod:`.seccomp` has no filter for the machine's architecture.
SECCOMP_GAP = ("Unix sockets in readable places (your home) can be reached by path: no "
               "seccomp filter for this machine's architecture (%s)")
#: Under bubblewrap, where ``--allow-write`` names a socket (``%s``).
SOCKET_GRANT_GAP = ("Unix sockets in readable places (your home) can be reached by path: "
                    "--allow-write names a socket (%s), so runs get no filter on Unix "
                    "sockets")


@attrs.frozen
class Support:
    """How runs can be confined here: ``kind`` ``None`` when they cannot, and why.

    ``bwrap``: bubblewrap's namespaces, Landlock's scopes and a seccomp filter on
    Unix sockets (every point of §13 where ``gaps`` is empty); ``landlock``:
    Landlock's filesystem rules alone (the
    fallback where bubblewrap cannot run); ``seatbelt``: macOS ``sandbox-exec``.
    """

    kind: Literal["bwrap", "landlock", "seatbelt"] | None
    #: e.g. ``bubblewrap 0.11.0, Landlock ABI 7``; empty when ``kind`` is ``None``.
    detail: str = ""
    #: Why not (``kind`` ``None``), or why not bubblewrap (``landlock``), in a
    #: sentence a person understands.
    reason: str = ""
    #: The points of §13 that do not hold for a run here; empty: all do, and its
    #: completion says ``"confined": true``.
    gaps: tuple[str, ...] = ()
    #: The bubblewrap to run (``kind`` ``bwrap``).
    bwrap: str = ""
    #: The kernel's Landlock ABI (0: none).
    abi: int = 0
    #: Runs (under bubblewrap, or Landlock alone) get :mod:`.seccomp`'s filter on
    #: Unix sockets (off where ``--allow-write`` names a socket: the filter cannot
    #: tell one socket from another, and ``gaps`` then says so).
    socket_filter: bool = True

    @property
    def complete(self) -> bool:
        """Every point of §13 holds for a run confined here."""
        return self.kind is not None and not self.gaps


def probe() -> Support:
    """What this machine offers: bubblewrap and Landlock on Linux, ``sandbox-exec``
    on macOS.

    Blocking for a few milliseconds on Linux (bubblewrap is started once to see
    that user namespaces work here): call it once, at start.
    """
    if sys.platform == "linux":
        return _linux()
    if sys.platform == "darwin":
        if os.access(SANDBOX_EXEC, os.X_OK):
            return Support("seatbelt", detail=f"macOS sandbox-exec ({SANDBOX_EXEC})")
        return Support(None, reason=f"macOS without {SANDBOX_EXEC}, which confines runs")
    system = platform.system() or sys.platform
    return Support(None, reason=("runs can be confined only on Linux (bubblewrap, Landlock) "
                                 f"and macOS (sandbox-exec), not on {system}"))


def _linux() -> Support:
    from prohost.engine.sandbox import bwrap, landlock, seccomp

    try:
        abi = landlock.abi_version()
    except OSError as error:
        abi, no_landlock = 0, _why_not(error.errno)
    else:
        no_landlock = ""
    program = bwrap.find()
    why_not = _bwrap_fails(program) if program else "bubblewrap is not installed"
    if not why_not and program:
        gaps: tuple[str, ...] = () if abi >= landlock.SCOPES_ABI else (SCOPE_GAP,)
        if seccomp.program() is None:
            gaps += (SECCOMP_GAP % seccomp.machine(),)
        detail = f"bubblewrap, Landlock ABI {abi}" if abi else "bubblewrap"
        return Support("bwrap", detail=detail, gaps=gaps, bwrap=program, abi=abi)
    if abi:
        gaps = LANDLOCK_GAPS
        if seccomp.program() is None:
            # Without the filter, Landlock's scopes (ABI 6) alone keep abstract ones off.
            gaps += (LANDLOCK_SOCKET_GAP % seccomp.machine(),
                     *(() if abi >= landlock.SCOPES_ABI else (SCOPE_GAP,)))
        return Support("landlock", detail=f"Landlock ABI {abi} alone", reason=why_not,
                       gaps=gaps, abi=abi)
    return Support(None, reason=f"{why_not}, and {no_landlock}")


def _bwrap_fails(program: str) -> str:
    """Why ``program`` (bubblewrap) cannot confine a run here; empty when it can."""
    import subprocess

    from prohost.engine.sandbox import bwrap

    try:
        done = subprocess.run(
            [program, *bwrap.namespaces(network=True), "--ro-bind", "/", "/", "--dev", "/dev",
             "--proc", "/proc", "--", "/bin/true"],
            capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError) as error:
        return f"bubblewrap could not be run: {error}"
    if done.returncode == 0:
        return ""
    said = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
    return (f"bubblewrap cannot make a sandbox here ({said[0]}): unprivileged user "
            "namespaces are off or restricted (kernel.unprivileged_userns_clone, "
            "user.max_user_namespaces, or an AppArmor rule such as Ubuntu 24.04's)")


def _why_not(errno: int | None) -> str:
    import errno as codes

    if errno == codes.ENOSYS:
        return (f"the kernel ({platform.release()}) has no Landlock: Linux 5.13 or later "
                "built with CONFIG_SECURITY_LANDLOCK is needed")
    if errno == codes.EOPNOTSUPP:
        return ("Landlock is built into the kernel but not enabled: add landlock to the "
                "kernel's lsm= boot parameter (see /sys/kernel/security/lsm)")
    if errno == codes.EPERM:
        return "Landlock is refused to this process (a seccomp filter or container policy)"
    return f"Landlock could not be queried: {os.strerror(errno or 0)}"
