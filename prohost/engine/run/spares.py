"""Runs' confinements made ahead, while the harness is idle: :class:`Spares`.

A confined run's rules take a couple of milliseconds of this process's time to
make (the complement walk checked, two hundred rules added: ``sandbox.cache``),
and at rest they were most of what confinement added between a delivery and the
agent's spawn (issue 29: within +10 % of an unconfined run). Without ``--repos``
a run's places do not depend on its conversation: its working directory, the
agent's folders for its account, the caches, and a scratch folder of its own. So
once a run is over, the next one's confinement is made ahead, with a scratch
folder of its own (named like a run's, 32 hex digits, so that the sweep at start
removes one a crash left behind), the thread that will spawn its agent is started
inside its domain, and everything its rules were made from is watched
(:meth:`prohost.engine.sandbox.Confinement.watch_for_changes`). The next run with
the same places takes it: its early confinement
(:class:`~prohost.engine.run.confine.EarlyConfinement`) reads the watch without
blocking (where nothing could be watched, the waiting thread checks with ``stat``
calls: :meth:`~prohost.engine.sandbox.Confinement.still_right`), and makes it anew
in the same scratch folder when something has changed. A run is never given rules
other than those its own preparation would make at its start.

One spare per kind of run (its places but the scratch folder), at most
:data:`MAX_KINDS`; made by one task (:meth:`Spares.serve`, in the harness's
nursery), one at a time, in a bounded file step, only when a run ends (so never
while a run is being started or reported at rest: its thread would compete with
theirs for the interpreter).
"""

from __future__ import annotations

import functools
import logging
import secrets
import shutil
from pathlib import Path

import attrs
import trio

from prohost.engine.agent.environment import SCRATCH_NAME_CHARS
from prohost.engine.blocking import Bounds
from prohost.engine.run.confine import (
    EarlyConfinement,
    Making,
    RunConfinement,
    RunPlaces,
    Sandbox,
)

log = logging.getLogger("prohost.confine")

#: Kinds of runs (places but the scratch folder) a spare is kept for: one per
#: account's folders and brain; more is a harness whose runs seldom repeat.
MAX_KINDS = 4
#: The bound on removing a spare's scratch folder at exit (a few syscalls).
REMOVE_S = 5.0

_Kind = tuple[Path | None, str, str | None, str | None]


def kind_of(places: RunPlaces) -> _Kind | None:
    """What decides a run's policy but its scratch folder (see
    :func:`prohost.engine.run.confine.policy_for`); ``None`` for a run with
    worktrees, whose places are its conversation's."""
    if places.worktrees or places.lane_folder is not None:
        return None
    env = places.env
    return (places.workdir, places.brain, env.get("CLAUDE_CONFIG_DIR"), env.get("CODEX_HOME"))


@attrs.define
class _Spare:
    places: RunPlaces
    made: RunConfinement


class Spares:
    """The harness's confinements made ahead (see the module)."""

    def __init__(self, sandbox: Sandbox, scratch_root: Path, bounds: Bounds) -> None:
        self._sandbox = sandbox
        self._root = scratch_root
        self._bounds = bounds
        self._kept: dict[_Kind, _Spare] = {}
        #: The places of the last run begun: what the next spare is made for.
        self._latest: RunPlaces | None = None
        self._wanted = trio.Event()
        self._made_one = trio.Event()
        #: Spares taken by a run, and made (for the tests and the bench).
        self.taken = 0
        self.made = 0

    def early(self, places: RunPlaces) -> EarlyConfinement:
        """The run's early confinement for ``places``: a spare's when one of the
        same kind is kept (its scratch folder is then the run's: read it from the
        result's ``places``), else one begun now. Remembers ``places`` for the next
        spare. Never blocks."""
        kind = kind_of(places)
        if kind is not None:
            self._latest = places
            spare = self._kept.pop(kind, None)
            if spare is not None:
                self.taken += 1
                return EarlyConfinement(self._sandbox, spare.places, spare.made)
        return EarlyConfinement(self._sandbox, places)

    def want(self) -> None:
        """A run has ended: make a spare for the kind of the last run begun, unless
        one is kept (the harness is idle now, or soon will be)."""
        self._wanted.set()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """Make the spares runs ask for (:meth:`want`), one at a time, until cancelled.

        A spare that cannot be made is logged and not tried again until the next
        run ends. Cancelled: one being made is abandoned at its bound (closed by its
        thread when it finishes; its folder is swept at the next start); those kept
        are closed and their folders removed (shielded, bounded).
        """
        task_status.started()
        try:
            while True:
                await self._wanted.wait()
                self._wanted = trio.Event()
                await self._make_one()
        finally:
            with trio.CancelScope(shield=True):
                await self._drop_all()

    async def _make_one(self) -> None:
        latest = self._latest
        kind = None if latest is None else kind_of(latest)
        support = self._sandbox.support
        if latest is None or kind is None or kind in self._kept or support is None:
            return
        if len(self._kept) >= MAX_KINDS:  # kinds that seldom repeat: start afresh
            await self._drop_all()
        places = attrs.evolve(
            latest, scratch=self._root / secrets.token_hex(SCRATCH_NAME_CHARS // 2))
        making = Making()
        try:
            made = await self._bounds.file_step(
                functools.partial(making.make, self._sandbox, support, places, spawner=False),
                what="confining the next run ahead")
            # Told of any change from now on, the run that takes it needs no check.
            await self._bounds.file_step(made.confinement.watch_for_changes,
                                         what="watching what the next run's rules depend on")
        except Exception as exc:
            making.abandon()
            # The next run makes its own, as without spares; its folder, if made, goes.
            log.warning("could not confine the next run ahead (it will be confined as "
                        "it starts): %s", exc)
            await self._remove(places.scratch)
            return
        except BaseException:
            making.abandon()
            raise
        # Its thread enters its domain now and waits, so that the run that takes it
        # starts none: the thread checks it is still right, then spawns.
        made.confinement.ready_spawner(first_wait_s=None)
        self._kept[kind] = _Spare(places, made)
        self.made += 1
        self._made_one.set()
        self._made_one = trio.Event()

    async def wait_made(self, count: int) -> None:
        """Return once ``count`` spares have been made in all (for the tests and the
        bench: making one is the harness's own business). Cancelled: nothing to undo."""
        while self.made < count:
            await self._made_one.wait()

    async def _drop_all(self) -> None:
        """Close every kept spare, then remove their folders (bounded steps)."""
        kept, self._kept = list(self._kept.values()), {}
        for spare in kept:
            spare.made.close()
        for spare in kept:
            await self._remove(spare.places.scratch)

    async def _remove(self, scratch: Path) -> None:
        try:
            await self._bounds.file_step(shutil.rmtree, scratch, True, limit_s=REMOVE_S,
                                         what="removing a spare's scratch folder")
        except OSError as exc:
            log.debug("could not remove %s (swept at the next start): %s", scratch, exc)
