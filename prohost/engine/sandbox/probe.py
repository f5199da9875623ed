"""Whether this machine can confine a run, and how: :func:`probe`."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any, Literal, Protocol

import attrs

#: Test-only: set to ``1`` and :func:`probe` says the machine cannot confine, as on a
#: kernel without Landlock. The simulation is at the probe, not in the kernel: it
#: lets a test show what ``--sandbox auto`` and ``required`` do there. Never set it
#: to turn confinement off (that is ``--sandbox off``).
SIMULATE_ABSENT_ENV = "PROHOST_TEST_SANDBOX_ABSENT"

#: Only this copy: one earlier on PATH could be anyone's (as Codex reasons).
SANDBOX_EXEC = "/usr/bin/sandbox-exec"


class Rules(Protocol):
    """What :class:`Support` may carry to keep runs' rules (``cache.RuleCache``;
    named by its shape here, so that this module imports no other of the room)."""

    def prepare(self, policy: Any, support: Support) -> Any:
        """The confinement for ``policy``, as ``confinement.prepare_anew`` makes it."""

    def close(self) -> None:
        """Release what it keeps."""


@attrs.frozen
class Support:
    """How runs can be confined here: ``kind`` ``None`` when they cannot, and why."""

    kind: Literal["landlock", "seatbelt"] | None
    #: e.g. ``Landlock ABI 7``; empty when ``kind`` is ``None``.
    detail: str = ""
    #: Why not, in a sentence a person understands; empty when ``kind`` is set.
    reason: str = ""
    #: Where :func:`~.confinement.prepare` keeps what runs' rules have in common
    #: (Landlock only; ``None``: every preparation made anew). The harness gives its
    #: own (``Sandbox.start``) and closes it at exit.
    rules: Rules | None = attrs.field(default=None, eq=False, repr=False)


def probe() -> Support:
    """What this machine offers: Landlock's ABI on Linux, ``sandbox-exec`` on macOS.

    Quick and blocking only for a moment (one syscall or one ``stat``).
    """
    if os.environ.get(SIMULATE_ABSENT_ENV) == "1":
        return Support(None, reason=("confinement is not available on this machine "
                                     f"(simulated for a test: {SIMULATE_ABSENT_ENV}=1)"))
    if sys.platform == "linux":
        return _linux()
    if sys.platform == "darwin":
        if os.access(SANDBOX_EXEC, os.X_OK):
            return Support("seatbelt", detail=f"macOS sandbox-exec ({SANDBOX_EXEC})")
        return Support(None, reason=f"macOS without {SANDBOX_EXEC}, which confines runs")
    system = platform.system() or sys.platform
    return Support(None, reason=("runs can be confined only on Linux (Landlock) and "
                                 f"macOS (sandbox-exec), not on {system}"))


def _linux() -> Support:
    from prohost.engine.sandbox import landlock

    try:
        abi = landlock.abi_version()
    except OSError as error:
        return Support(None, reason=_why_not(error.errno))
    return Support("landlock", detail=f"Landlock ABI {abi}")


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
