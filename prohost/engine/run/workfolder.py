"""The agents' working folder (``--workdir``): made once per harness, not per run.

Making it is a blocking file step, so it costs a worker-thread hop; before every
run that was a hop for a ``mkdir -p`` that found the folder there every time but
the first. It is made at the first run that needs it, and remembered. A folder
removed afterwards is noticed when an agent cannot start in it
(:func:`prohost.engine.run.execute.execute` then forgets it, makes it again and
spawns once more), so removing it between runs still costs no run.
"""

from __future__ import annotations

import os
from pathlib import Path

from prohost.engine.blocking import Bounds

__all__ = ["WorkFolder"]


class WorkFolder:
    """One harness's working folder, and whether it has made it already."""

    def __init__(self, path: Path) -> None:
        self.path = path
        #: Made (or found) by :meth:`ensure` and not known to be gone since.
        self.made = False

    async def ensure(self, bounds: Bounds) -> None:
        """Make the folder (``mkdir -p``) unless it was made before; raises ``OSError``.

        Cancelled: as :meth:`Bounds.file_step` (abandoning is safe: a ``mkdir -p``
        touches nothing trio owns); it is then not remembered as made.
        """
        if self.made:
            return
        await bounds.file_step(os.makedirs, self.path, 0o777, True,
                               what=f"creating the working directory {self.path}")
        self.made = True

    def forget(self) -> None:
        """It may be gone (an agent could not start in it): make it at the next
        :meth:`ensure`."""
        self.made = False
