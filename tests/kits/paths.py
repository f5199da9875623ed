"""Where things are, for tests in any folder: found from this file, never from the
test's own place, so a test module can move without its paths breaking."""

from __future__ import annotations

from pathlib import Path

#: The ``tests`` folder.
TESTS = Path(__file__).resolve().parents[1]
#: The repository's root (``prohost/``, ``scripts/``, ``docs/`` are in it).
ROOT = TESTS.parent
#: The fake agents, run as subprocesses by path.
AGENTS = TESTS / "agents"
#: The benchmark and soak scripts.
SCRIPTS = ROOT / "scripts"
#: The child that dies by SIGKILL at a chosen point of the ledger's life.
LEDGER_CRASH_CHILD = TESTS / "kits" / "ledger_crash_child.py"


def logs_folder(tmp_path: Path) -> Path:
    """The folder a test's fake agents log into (made here). Agents run confined
    (docs/protocol.md §13): the kits that start a harness name this folder with
    ``--allow-write``, and nothing else of ``tmp_path`` is opened to them."""
    folder = tmp_path / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder
