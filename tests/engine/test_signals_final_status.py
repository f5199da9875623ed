"""The last instants of ``agent run`` (prohost.engine.signals.final_status, §9).

Each case runs in a child interpreter, since it changes the process's signal
dispositions for good.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.protocol("§9")

CHILD = textwrap.dedent(
    """
    import os, signal, sys, threading
    from prohost.engine import signals

    signals.install()
    idle = threading.Event()
    # Like trio's cached worker threads: alive, with signals unblocked.
    threading.Thread(target=idle.wait, daemon=True).start()
    if sys.argv[1] == "one before":
        os.kill(os.getpid(), signal.SIGTERM)          # counted by the handler
    elif sys.argv[1] == "two, one pending":
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pthread_sigmask(signal.SIG_BLOCK, signals.WATCHED)
        os.kill(os.getpid(), signal.SIGTERM)          # still pending at the end
    status = signals.final_status(0)
    ignored = all(signal.getsignal(s) is signal.SIG_IGN for s in signals.WATCHED)
    # A signal now, taken by whichever thread, must change nothing.
    os.kill(os.getpid(), signal.SIGTERM)
    print(status, ignored)
    """
)


def run_child(case: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-c", CHILD, case], capture_output=True,
                          text=True, timeout=60)
    return done.returncode, done.stdout.strip()


def test_a_drain_with_one_signal_exits_0_and_ignores_later_ones() -> None:
    assert run_child("one before") == (0, "0 True")


def test_a_second_signal_still_pending_at_the_end_counts_as_a_stop() -> None:
    assert run_child("two, one pending") == (0, "130 True")
