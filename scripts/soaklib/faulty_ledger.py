"""A ledger whose disk fails, for the soak's harnesses (``scripts/soak.py --disk-full
hook``, where the soak may not mount a small filesystem to fill) and for the tests
that run a harness as a subprocess on a disk that hangs.

Run as the program in place of ``python -m prohost``::

    python scripts/soaklib/faulty_ledger.py [--full-while FILE] [--hang-while FIFO] \\
        -- agent run ...

It sets the ledger's connection class (``prohost.engine.ledger.schema.connection_class``,
the one seam) to :func:`faulty_connection`'s, then runs ``prohost``. While ``FILE``
exists, every ledger COMMIT fails as on a full disk; while ``FIFO`` exists, every
COMMIT first opens it for reading, which blocks until something opens it for writing:
a disk that hangs. The product itself reads no switch for either.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sqlite3
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()


def faulty_connection(full_while: str = "", hang_while: str = "") -> type[sqlite3.Connection]:
    """A connection class whose COMMIT fails with SQLITE_FULL's message while
    ``full_while`` exists, and hangs while the FIFO ``hang_while`` exists."""

    class FaultyConnection(sqlite3.Connection):
        def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
            if sql == "COMMIT" and hang_while and os.path.exists(hang_while):
                with open(hang_while, "rb"):
                    pass
            if sql == "COMMIT" and full_while and os.path.exists(full_while):
                raise sqlite3.OperationalError("database or disk is full")
            return super().execute(sql, parameters)

    return FaultyConnection


def program(*, full_while: str = "", hang_while: str = "") -> list[str]:
    """The argv prefix that runs ``prohost`` with this ledger."""
    argv = [sys.executable, str(HERE)]
    if full_while:
        argv += ["--full-while", full_while]
    if hang_while:
        argv += ["--hang-while", hang_while]
    return [*argv, "--"]


def main() -> None:
    args = sys.argv[1:]
    split = args.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--full-while", default="")
    parser.add_argument("--hang-while", default="")
    faults = parser.parse_args(args[:split])
    sys.path.insert(0, str(HERE.parents[2]))  # the checkout's prohost
    from prohost.engine.ledger import schema

    schema.connection_class = faulty_connection(faults.full_while, faults.hang_while)
    sys.argv = ["prohost", *args[split + 1:]]
    runpy.run_module("prohost", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
