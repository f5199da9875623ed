"""Confinement of a run's whole process tree (docs/protocol.md §13), the OS-facing part.

:func:`probe` says what this machine offers (bubblewrap with Landlock's scopes,
Landlock alone, or ``sandbox-exec`` on macOS); :func:`prepare` turns a
:class:`Policy` into a :class:`Confinement` a spawn applies, anew for each attempt
(:func:`prohost.engine.agent.process.start_agent`); :func:`confined_command` is a
one-shot command's (the harness's own git on a run's places). :mod:`.defaults`
lists the usual secrets, caches and device files. Nothing here imports the rest of
prohost: the harness decides each run's places and hands them in.
"""

from prohost.engine.sandbox import bwrap, defaults, seatbelt
from prohost.engine.sandbox.bwrap import confined_command
from prohost.engine.sandbox.confinement import Confinement, ConfinementFailed, prepare
from prohost.engine.sandbox.policy import Policy
from prohost.engine.sandbox.probe import Support, probe

__all__ = ["Confinement", "ConfinementFailed", "Policy", "Support", "bwrap",
           "confined_command", "defaults", "prepare", "probe", "seatbelt"]
