"""The scripts of ``scripts/`` as modules, for the tests of the benchmarks and the
soak."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from tests.kits.paths import SCRIPTS


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` as a module (not a package: it imports its neighbours,
    bench_e2e.py and bench_rest.py, by name)."""
    sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
