#!/usr/bin/env python3
"""The table in docs/protocol.md from each of its sections to the tests of its rules.

Usage: .venv/bin/python scripts/protocol_table.py [--check]

A test says which sections it checks with ``@pytest.mark.protocol("§3", ...)`` (on
the function, a class, or the module's ``pytestmark``). The tests are found the way
pytest finds them: this script collects the whole suite (the ``slow`` tests too,
``--collect-only``, no test runs) in a child ``python -m pytest`` with a small plugin
that writes, for each test, the sections of every ``protocol`` mark it carries. So
marks from any level, parametrized tests and conftest-made marks count exactly as
pytest sees them, and no regular expression reads the source.

Without arguments the table between the BEGIN and END lines of docs/protocol.md is
written again; ``--check`` writes nothing and exits 1 when it is stale.
tests/docs/test_protocol_table.py makes the same comparison in every default run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "protocol.md"
COMMAND = ".venv/bin/python scripts/protocol_table.py"

BEGIN = (f"<!-- BEGIN protocol-table: made by `{COMMAND}` from the tests' "
         "@pytest.mark.protocol marks; do not edit by hand -->")
END = "<!-- END protocol-table -->"

#: docs/protocol.md's sections, as its headings name them.
SECTIONS = {
    "§1": "Connection",
    "§2": "Messages",
    "§3": "Deliveries and acks",
    "§4": "Lanes and scheduling",
    "§5": "Executing a run",
    "§6": "Cancellation",
    "§7": "Results and the ledger",
    "§8": "Timeline",
    "§9": "Shutdown",
    "§10": "Pairing",
    "§11": "Reference-server extras",
    "§12": "Agent accounts and usage limits",
    "§13": "Confinement",
}


class MarkError(Exception):
    """A ``protocol`` mark that names no section, or one docs/protocol.md does not have."""


class _Plugin:
    """Loaded into the child pytest: each collected test's protocol sections."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def pytest_collection_finish(self, session: Any) -> None:
        found = {}
        for item in session.items:
            found[item.nodeid] = [
                {"args": list(mark.args), "kwargs": sorted(mark.kwargs)}
                for mark in item.iter_markers("protocol")
            ]
        self.out.write_text(json.dumps(found), encoding="utf-8")


def _collect_here(out: Path) -> int:
    """The child's side: collect the suite with :class:`_Plugin`, write to ``out``."""
    import pytest

    # addopts is replaced: no worker processes, nothing deselected (the slow soak too).
    args = ["--collect-only", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
            "--strict-markers", "tests"]
    return int(pytest.main(args, plugins=[_Plugin(out)]))


def collect() -> dict[str, list[str]]:
    """Each test that carries a protocol mark (its node id, without parameters), with
    its sections in docs/protocol.md's order; tests of one function are one entry."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "marks.json"
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--collect-into", str(out)],
            cwd=ROOT, capture_output=True, text=True, check=False,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        )
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(f"pytest could not collect the tests:\n{done.stdout}{done.stderr}")
        marks: dict[str, list[dict[str, Any]]] = json.loads(out.read_text(encoding="utf-8"))
    order = list(SECTIONS)
    tests: dict[str, set[str]] = defaultdict(set)
    for nodeid, found in marks.items():
        for mark in found:
            if not mark["args"] or mark["kwargs"] or any(a not in SECTIONS for a in mark["args"]):
                raise MarkError(f"{nodeid}: @pytest.mark.protocol takes sections "
                                f"{order[0]} to {order[-1]}, got {mark['args']} {mark['kwargs']}")
            tests[nodeid.split("[", 1)[0]].update(mark["args"])
    return {test: sorted(secs, key=order.index) for test, secs in sorted(tests.items())}


def render(tests: dict[str, list[str]]) -> str:
    """The table, BEGIN and END lines included: a row per section and test file."""
    by_section: dict[str, dict[str, list[str]]] = {s: defaultdict(list) for s in SECTIONS}
    for test, secs in tests.items():
        path, _, name = test.partition("::")
        for section in secs:
            by_section[section][path].append(name)
    lines = [
        BEGIN,
        "",
        "| section | test file | tests |",
        "| --- | --- | --- |",
    ]
    for section, title in SECTIONS.items():
        files = by_section[section]
        count = sum(len(names) for names in files.values())
        head = f"{section} {title} ({count})"
        if not files:
            lines.append(f"| {head} | none yet | |")
        for path, names in sorted(files.items()):
            listed = ", ".join(f"`{name}`" for name in sorted(names))
            lines.append(f"| {head} | `{path}` | {listed} |")
    lines += ["", END]
    return "\n".join(lines)


def current(text: str) -> str | None:
    """The table now in ``text`` (docs/protocol.md), BEGIN and END lines included."""
    match = re.search(re.escape(BEGIN) + r".*?" + re.escape(END), text, flags=re.DOTALL)
    return match.group(0) if match else None


def replaced(text: str, table: str) -> str:
    """``text`` with its table replaced by ``table`` (appended, with a heading, if none)."""
    if current(text) is None:
        return text.rstrip("\n") + "\n\n## Tests by section\n\n" + table + "\n"
    return text.replace(current(text) or "", table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when docs/protocol.md's table is stale")
    parser.add_argument("--collect-into", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.collect_into is not None:
        return _collect_here(args.collect_into)
    try:
        table = render(collect())
    except MarkError as error:
        print(error, file=sys.stderr)
        return 1
    text = DOC.read_text(encoding="utf-8")
    if args.check:
        if current(text) != table:
            print(f"docs/protocol.md's table of tests is stale: run {COMMAND}", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(replaced(text, table), encoding="utf-8")
    print(f"wrote the table of {len(SECTIONS)} sections into {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
