"""``python -m prohost`` with two seams at the very edges of the process, for the
tests of §9's signals there (tests/process/test_signals.py). Run as a script:

    python tests/kits/signal_edges.py [--early-line] [--pause-at-exit S] -- agent run ...

``--early-line`` prints :data:`EARLY_LINE` on stderr as soon as prohost has put its
signal handlers in place (``prohost/__main__.py`` does before it imports the
harness), so a test can send a signal at
the earliest moment that counts. ``--pause-at-exit S``: once the supervisor has
returned, :data:`EXIT_PAUSE_LINE` is printed and the process waits up to S seconds
for a signal before it decides its exit status, so a test hits that last window
every time. The product itself has neither: both are set here, from outside.
"""

from __future__ import annotations

import argparse
import os
import runpy
import select
import signal
import sys
from collections.abc import Callable
from pathlib import Path

EARLY_LINE = "prohost: signal handlers installed"
EXIT_PAUSE_LINE = "prohost: the supervisor has returned; exiting"
#: This file, to run: ``[sys.executable, SCRIPT, ...]``.
SCRIPT = str(Path(__file__).resolve())


def paused(final_status: Callable[[int], int], wait_s: float) -> Callable[[int], int]:
    """``final_status`` after a wait of up to ``wait_s`` for a signal, race-free: the
    handler's wakeup byte is in the pipe already if the signal came before ``select``."""

    def pause_then_decide(code: int) -> int:
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        previous = signal.set_wakeup_fd(write_end)
        try:
            print(EXIT_PAUSE_LINE, file=sys.stderr, flush=True)
            select.select([read_end], [], [], wait_s)
        finally:
            signal.set_wakeup_fd(previous)
            os.close(read_end)
            os.close(write_end)
        return final_status(code)

    return pause_then_decide


def announced(install: Callable[[], None]) -> Callable[[], None]:
    """``install``, then :data:`EARLY_LINE` (once)."""

    def install_then_say() -> None:
        first = not said
        install()
        if first:
            said.append(True)
            print(EARLY_LINE, file=sys.stderr, flush=True)

    said: list[bool] = []
    return install_then_say


def main() -> None:
    args = sys.argv[1:]
    split = args.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--early-line", action="store_true")
    parser.add_argument("--pause-at-exit", type=float)
    seams = parser.parse_args(args[:split])
    # The checkout's prohost, as `python -m prohost` from its root would import it.
    sys.path.insert(0, str(Path(SCRIPT).parents[2]))
    from prohost.engine import signals

    # Not installed here: the line says when prohost itself installed them.
    if seams.early_line:
        signals.install = announced(signals.install)
    if seams.pause_at_exit is not None:
        signals.final_status = paused(signals.final_status, seams.pause_at_exit)
    sys.argv = ["prohost", *args[split + 1:]]
    runpy.run_module("prohost", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
