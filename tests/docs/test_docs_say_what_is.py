"""The docs say what the program does and its figures as they stand, not the
project's history: no "issue 19; third pass", no "the TypeScript original". The
history of a change is the CHANGELOG's (which may name issues).
"""

from __future__ import annotations

import re

from tests.kits.paths import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
HISTORY = re.compile(r"\bissues? \d+|\bissue-\d+|TypeScript original", re.IGNORECASE)
#: Other projects' issues, cited as sources (the page names the project with them).
CITED = re.compile(r"[\w.-]+/[\w.-]+ issues? \d+")


def history_words(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines()
            if HISTORY.search(CITED.sub("", line))]


def test_no_page_reads_as_the_project_s_history() -> None:
    found = {page.name: history_words(page.read_text()) for page in PAGES}
    assert {page: lines for page, lines in found.items() if lines} == {}


def test_the_reader_finds_history_words_and_spares_cited_sources() -> None:
    assert history_words("## The nine reproductions of issue 8\nfine") == [
        "## The nine reproductions of issue 8"]
    assert history_words("(issue 19; third pass)") != []
    assert history_words("The floor is the TypeScript original's design") != []
    assert history_words("the on-disk `issue-16` branch") != []
    assert history_words("| Gemini API | none | google-gemini/gemini-cli issues 1848, 1905 |") == []
