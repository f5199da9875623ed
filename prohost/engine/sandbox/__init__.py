"""Confinement of a run's whole process tree (docs/protocol.md §13), the OS-facing part.

:func:`probe` says what this machine offers (Landlock on Linux, ``sandbox-exec`` on
macOS); :func:`prepare` turns a :class:`Policy` into a :class:`Confinement` a spawn
applies (on Linux a ``preexec``, or better a spawn from a confined thread:
:meth:`Confinement.spawn_from_a_confined_thread`, which the harness's spawn uses:
:func:`prohost.engine.agent.process.run_agent`; on macOS an ``argv_prefix``).
:class:`RuleCache` keeps what runs' rules have in common (:mod:`.cache`).
:mod:`.defaults` lists the usual secrets, caches and device files. Nothing here
imports the rest of prohost: the harness decides each run's places and hands them in.
"""

from prohost.engine.sandbox import bwrap, defaults, seatbelt, spawner
from prohost.engine.sandbox.bwrap import confined_command
from prohost.engine.sandbox.cache import RuleCache
from prohost.engine.sandbox.confinement import Confinement, prepare
from prohost.engine.sandbox.policy import Policy
from prohost.engine.sandbox.probe import SIMULATE_ABSENT_ENV, Support, probe

__all__ = ["SIMULATE_ABSENT_ENV", "Confinement", "Policy", "RuleCache", "Support", "bwrap",
           "confined_command", "defaults", "prepare", "probe", "seatbelt", "spawner"]
