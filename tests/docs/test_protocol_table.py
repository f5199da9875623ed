"""docs/protocol.md's table from each of its sections to its tests is made from the
tests' ``@pytest.mark.protocol`` marks (scripts/protocol_table.py): here it is made
again in memory, from pytest's own collection of the whole suite, and compared."""

from __future__ import annotations

import difflib

from tests.kits.paths import ROOT
from tests.kits.scripts import load_script

protocol_table = load_script("protocol_table")


def test_the_protocol_table_is_current_and_every_section_but_13_has_tests() -> None:
    # The suite is collected by a child pytest (one inside this one would share its
    # plugins and state).
    tests = protocol_table.collect()
    sections = {section for secs in tests.values() for section in secs}
    untested = [s for s in protocol_table.SECTIONS if s not in sections and s != "§13"]
    assert not untested, f"no test is marked @pytest.mark.protocol for {untested}"
    expected = protocol_table.render(tests)
    doc = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8")
    found = protocol_table.current(doc) or ""
    diff = "\n".join(difflib.unified_diff(found.splitlines(), expected.splitlines(),
                                          "docs/protocol.md", "the tests' marks", lineterm=""))
    assert found == expected, (
        f"docs/protocol.md's table of tests by section is stale: run "
        f"{protocol_table.COMMAND}\n{diff}")
