"""The confinements made ahead (``engine/run/spares.py``): one kept per kind of run,
at most four kinds, each with a scratch folder of its own that is removed with it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from prohost.engine.blocking import Bounds
from prohost.engine.run.confine import RunPlaces, Sandbox
from prohost.engine.run.spares import MAX_KINDS, Spares
from prohost.engine.sandbox import SIMULATE_ABSENT_ENV, probe
from prohost.options import Options

pytestmark = pytest.mark.skipif(probe().kind != "landlock",
                                reason=f"no Landlock here: {probe().reason}")


def places_of(tmp_path: Path, kind: int) -> RunPlaces:
    """A run's places of kind ``kind`` (its own working directory); the run's own
    scratch folder outside the spares' folder."""
    return RunPlaces(workdir=tmp_path / f"work-{kind}", worktrees=(), lane_folder=None,
                     scratch=tmp_path / "run-scratch" / str(kind), brain="plain",
                     env={"HOME": str(tmp_path / "user")})


async def test_at_most_four_kinds_are_kept_and_none_outlives_the_harness(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(SIMULATE_ABSENT_ENV, raising=False)
    (tmp_path / "user").mkdir()
    home = tmp_path / "home"
    runs = home / "runs"
    sandbox = Sandbox.start(Options(home=home, machine="test"), {"HOME": str(tmp_path / "user")})
    spares = Spares(sandbox, runs, Bounds())
    try:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                await nursery.start(spares.serve)
                for kind in range(MAX_KINDS + 1):
                    # A run of that kind begins (nothing kept for it) and ends.
                    spares.early(places_of(tmp_path, kind)).discard()
                    spares.want()
                    await spares.wait_made(kind + 1)
                    kept = os.listdir(runs)
                    assert len(kept) == (kind + 1 if kind < MAX_KINDS else 1), kept
                # The last kind's spare is taken by its next run, with its folder.
                taken = spares.early(places_of(tmp_path, MAX_KINDS))
                assert taken.places.scratch.parent == runs
                assert taken.places.scratch.name in kept
                taken.discard()
                assert spares.taken == 1
                spares.want()
                await spares.wait_made(MAX_KINDS + 2)
                nursery.cancel_scope.cancel()
    finally:
        sandbox.close()
    # The run removes its own (taken) folder; the harness's exit removes the rest.
    assert os.listdir(runs) == [taken.places.scratch.name]
