"""scripts/relayout.py: a branch from before the move to commands/, engine/ and wire/
is rewritten to import what exists now, and keeps its log names."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "relayout.py"


def load_relayout() -> ModuleType:
    spec = importlib.util.spec_from_file_location("relayout", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


relayout = load_relayout()

OLD = '''\
from prohost import __version__, intake, ledger as ledger_module
from prohost.harness import Endpoints, Harness
from prohost.protocol import Ack
import prohost.signature
log = logging.getLogger("prohost.harness")
LABEL = "ai.prohost.agent"
see prohost/worktrees.py and prohost/brains/claude.py
'''


def test_every_moved_module_is_imported_from_where_it_is_now() -> None:
    new = relayout.rewrite(OLD)
    assert new.splitlines() == [
        "from prohost import __version__",
        "from prohost.wire import intake",
        "from prohost.engine import ledger as ledger_module",
        "from prohost.engine.harness import Endpoints, Harness",
        "from prohost.wire.protocol import Ack",
        "import prohost.wire.signature",
        'log = logging.getLogger("prohost.harness")',  # log names stay as users know them
        'LABEL = "ai.prohost.agent"',  # the daemon's label is not a module
        "see prohost/engine/worktrees.py and prohost/engine/brains/claude.py",
    ]


def test_every_new_place_exists() -> None:
    for old, new in relayout.MOVES.items():
        importlib.import_module(f"prohost.{new}")
        assert importlib.util.find_spec(f"prohost.{old}") is None, old


def test_it_rewrites_files_in_place(tmp_path: Path) -> None:
    file = tmp_path / "old.py"
    file.write_text("from prohost.runner import HeldRun\n")
    result = subprocess.run([sys.executable, str(SCRIPT), str(file)], capture_output=True,
                            text=True, check=True)
    assert file.read_text() == "from prohost.engine.runner import HeldRun\n"
    assert result.stdout.strip() == f"rewrote {file}"
