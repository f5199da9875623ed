"""``scripts/install`` is quiet about the project's own files and ends with the next
step (issue 31, point 11).

The install itself was run by hand on a fresh clone (no warning left but pip's own
index notes); these pin what made the warnings go away, since a full install in the
suite would cost a new virtualenv per run.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_license_is_an_spdx_string_for_a_setuptools_that_reads_it() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    # A table (`{ text = "MIT" }`) printed a deprecation warning three times per install.
    assert project["project"]["license"] == "MIT"
    assert project["build-system"]["requires"] == ["setuptools>=77"]
    # A root package folder makes the editable install a plain .pth (no finder warning).
    assert project["tool"]["setuptools"]["package-dir"] == {"": "."}


def test_the_install_ends_with_what_to_run_next() -> None:
    last = (ROOT / "scripts" / "install").read_text().strip().splitlines()[-1]
    assert last.startswith("echo ") and ".venv/bin/prohost demo" in last
