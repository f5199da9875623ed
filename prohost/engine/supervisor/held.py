"""The table of held runs: every run this process has taken responsibility for and
not let go of yet (queued, waiting for an account, running, or being reported).

A run is held from the moment the ledger has it until its report settles (or the
server forgets it); a run held here is answered from memory at a redelivery (§3).
The table says when it changes, so that waiters (a drain, the panel) look again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prohost.engine.run.heldrun import HeldRun


class HeldRuns(Mapping[str, HeldRun]):
    """The held runs by run id; read it as a mapping, change it with
    :meth:`hold` and :meth:`release`."""

    def __init__(self, on_change: Callable[[], None]) -> None:
        self._runs: dict[str, HeldRun] = {}
        self._on_change = on_change

    def __getitem__(self, run_id: str) -> HeldRun:
        return self._runs[run_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._runs)

    def __len__(self) -> int:
        return len(self._runs)

    def hold(self, held: HeldRun) -> None:
        """Hold ``held`` (replacing nothing: a run id is held at most once)."""
        self._runs[held.run_id] = held
        self._on_change()

    def release(self, held: HeldRun) -> None:
        """Let ``held`` go, if it is still the run held under its id."""
        if self._runs.get(held.run_id) is held:
            del self._runs[held.run_id]
            self._on_change()
