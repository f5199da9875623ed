"""The mark of a test that needs every point of §13 to hold on this machine: it
runs a hostile agent through the real harness and judges by what happened outside
the run, which only a complete confinement (bubblewrap with its socket filter) can
promise. Elsewhere it is skipped, saying what the machine lacks."""

from __future__ import annotations

import pytest

from prohost.engine.sandbox import probe

#: Skips unless this machine confines runs fully, with the probe's reason.
NEEDS_FULL_CONFINEMENT = pytest.mark.skipif(
    not probe().complete, reason=f"this system cannot confine runs fully: {probe().reason}")

#: A whole module of §13 tests that need it.
SECTION_13_CONFINED = [pytest.mark.protocol("§13"), NEEDS_FULL_CONFINEMENT]
