"""A macOS sandbox profile (SBPL, for ``sandbox-exec -p``) made from a :class:`Policy`.

Like Codex's (codex-rs, ``seatbelt.rs``), the profile names canonical paths (the
policy is resolved first, so ``/var/…`` is ``/private/var/…`` as the kernel sees it)
and matches folders with ``subpath``. Unlike Codex's deny-by-default base policy,
it starts from ``(allow default)``: everything but files stays as the agent's
unconfined tools expect (§13 confines files only; the network is not confined).
In SBPL the *last* matching rule wins, so the order is the policy:

1. ``(allow default)``, then ``(deny file-write*)``: the machine is read-only;
2. ``(allow file-write* …)`` for each writable place (and each device file);
3. ``(deny file-read* file-write* …)`` for each hidden place;
4. the grants that lie inside a hidden place again, so they win over it:
   ``(allow file-read* …)`` for readable ones, read and write for writable ones.

Paths are written as SBPL string literals (backslash and double quote escaped).
This module is unit-tested as text; ``sandbox-exec`` itself is not run on Linux CI.
"""

from __future__ import annotations

from pathlib import Path

from prohost.engine.sandbox.policy import Policy, is_within


def quote(path: Path | str) -> str:
    """``path`` as an SBPL string literal."""
    text = str(path).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def _match(path: Path) -> str:
    # subpath matches the path itself and everything beneath it: a file too.
    return f"(subpath {quote(path)})"


def profile(policy: Policy) -> str:
    """The profile text for ``policy`` (give it resolved: :meth:`Policy.resolved`)."""
    lines = ["(version 1)", "(allow default)", "(deny file-write*)"]
    lines += [f"(allow file-write* {_match(path)})" for path in policy.writable]
    lines += [f"(deny file-read* file-write* {_match(path)})" for path in policy.hidden]

    def inside_hidden(path: Path) -> bool:
        return any(is_within(path, place) for place in policy.hidden)

    lines += [f"(allow file-read* {_match(path)})"
              for path in policy.readable if inside_hidden(path)]
    lines += [f"(allow file-read* file-write* {_match(path)})"
              for path in policy.writable if inside_hidden(path)]
    return "\n".join(lines) + "\n"
