"""What a report's ``changes`` and ``usage`` (docs/protocol.md §7) say, in a few words
for people: ``prohost send --wait``, ``agent status`` and the panel share these.

They read JSON that came over the network (a server's runs API) or from the ledger,
so nothing about its shape is assumed: what is not as §7 says is left out, never
raised.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prohost.engine.view.statustext import cost_text


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _list(mapping: Mapping[str, Any], key: str) -> list[Any]:
    value = mapping.get(key)
    return value if isinstance(value, list) else []


def _text(mapping: Mapping[str, Any], key: str) -> str | None:
    """A string field as it may be shown on a terminal: control characters (a file
    name may hold a newline or an escape sequence) written as escapes."""
    value = mapping.get(key)
    if not isinstance(value, str):
        return None
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in value[:300])


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def _tally(entries: list[Mapping[str, Any]]) -> tuple[int, int, int, int, int]:
    """Files changed, lines added and removed, commits, and how many files those
    lines cover over ``entries``: only the listed files have counts (at most 100 a
    checkout; ``more_files`` has none)."""
    rows = [row for entry in entries for row in _list(entry, "files")
            if isinstance(row, Mapping)]
    files = len(rows) + sum(_count(entry.get("more_files")) or 0 for entry in entries)
    added = sum(_count(row.get("added")) or 0 for row in rows)
    removed = sum(_count(row.get("removed")) or 0 for row in rows)
    commits = sum(_count(entry.get("commits")) or 0 for entry in entries)
    return files, added, removed, commits, len(rows)


def _lines(total: int, added: int, removed: int, listed: int) -> str:
    """``3 files (+12 −2)``; when some files are not listed, what the lines cover:
    ``250 files (+12 −2 in the 100 listed)``."""
    counts = f"+{added:,} −{removed:,}"
    if listed < total:
        counts += f" in the {listed:,} listed"
    return f"{_plural(total, 'file')} ({counts})"


def files_line(entry: Mapping[str, Any]) -> str:
    """One checkout's changes: ``app: 3 files (+12 −2), 1 commit on main``, or
    ``app: could not be read (…)``, or ``app: nothing changed``."""
    repo = _text(entry, "repo") or "?"
    error = _text(entry, "error")
    if error is not None:
        return f"{repo}: could not be read ({error})"
    total, added, removed, commits, listed = _tally([entry])
    truncated = _text(entry, "truncated")
    if not total and truncated is not None:
        text = f"{repo}: files not listed"
    elif not total and not commits:
        return f"{repo}: nothing changed"
    else:
        text = f"{repo}: {_lines(total, added, removed, listed)}"
    if commits:
        branch = _text(entry, "branch")
        text += f", {_plural(commits, 'commit')}"
        if branch is not None:
            text += f" on {branch}"
    if truncated is not None:
        text += f" ({truncated})"
    return text


def file_lines(entry: Mapping[str, Any], most: int = 10) -> list[str]:
    """Up to ``most`` of one checkout's files, one per line:
    ``M src/app.py +10 −2``, ``A notes.md +3 −0 (not committed)``, ``R new ← old``."""
    files = _list(entry, "files")
    lines = []
    for row in [row for row in files if isinstance(row, Mapping)][:most]:
        change = _text(row, "change") or "?"
        mark = {"added": "A", "modified": "M", "deleted": "D", "renamed": "R"}.get(change, "?")
        text = f"{mark} {_text(row, 'path') or '?'}"
        old = _text(row, "from")
        if old is not None:
            text += f" ← {old}"
        added, removed = _count(row.get("added")), _count(row.get("removed"))
        text += " (binary)" if added is None or removed is None else f" +{added} −{removed}"
        if row.get("committed") is False:
            text += " (not committed)"
        lines.append(text)
    left = len(files) - len(lines) + (_count(entry.get("more_files")) or 0)
    if left > 0:
        lines.append(f"… and {_plural(left, 'more file')}")
    return lines


def changes_lines(changes: object) -> list[str]:
    """Every checkout's summary line (see :func:`files_line`); none without ``changes``."""
    if not isinstance(changes, Sequence) or isinstance(changes, str):
        return []
    return [files_line(entry) for entry in changes if isinstance(entry, Mapping)]


def changes_summary(changes: object) -> str | None:
    """Every checkout together, in a few words: ``3 files (+12 −2), 1 commit``,
    ``nothing changed``, ``2 unreadable``; ``None`` without ``changes``. Lines are
    those of the listed files (``+12 −2 in the 100 listed`` when some are not)."""
    if not isinstance(changes, list):
        return None
    entries = [entry for entry in changes if isinstance(entry, Mapping)]
    unreadable = sum(1 for entry in entries if _text(entry, "error") is not None)
    total, added, removed, commits, listed = _tally(entries)
    parts = []
    if total:
        parts.append(_lines(total, added, removed, listed))
    if commits:
        parts.append(_plural(commits, "commit"))
    if unreadable:
        parts.append(f"{unreadable} unreadable")
    return ", ".join(parts) or "nothing changed"


def where_text(changes: object) -> str | None:
    """Where each checkout that changed now is: ``app on prohost/conv-1 at
    1a2b3c4d5e6f``, ``; ``-joined (``detached`` for no branch); ``None`` when none
    changed. The reply line's answer to "where is the agent's work?" (issue 31)."""
    if not isinstance(changes, list):
        return None
    places = []
    for entry in changes:
        if not isinstance(entry, Mapping) or _text(entry, "error") is not None:
            continue
        files, _, _, commits, _ = _tally([entry])
        if not files and not commits:
            continue
        branch = _text(entry, "branch")
        head = _text(entry, "head")
        place = f"{_text(entry, 'repo') or '?'} on {branch or 'a detached HEAD'}"
        if head is not None:
            place += f" at {head[:12]}"
        places.append(place)
    return "; ".join(places) or None


def usage_line(usage: object) -> str | None:
    """``1,200 in · 380 out tokens (900 cached) · $0.0123 · 3 turns · model``; ``None``
    when nothing is known."""
    if not isinstance(usage, Mapping):
        return None
    parts = []
    tokens_in, tokens_out = _count(usage.get("input_tokens")), _count(usage.get("output_tokens"))
    if tokens_in is not None or tokens_out is not None:
        tokens = f"{tokens_in or 0:,} in · {tokens_out or 0:,} out tokens"
        cached = _count(usage.get("cache_read_tokens"))
        if cached:
            tokens += f" ({cached:,} cached)"
        parts.append(tokens)
    cost = usage.get("cost_usd")
    if isinstance(cost, int | float) and not isinstance(cost, bool) and cost >= 0:
        parts.append(cost_text(float(cost)))
    turns = _count(usage.get("turns"))
    if turns is not None:
        parts.append(_plural(turns, "turn"))
    model = _text(usage, "model")
    if model is not None:
        parts.append(model[:60])
    return " · ".join(parts) or None

