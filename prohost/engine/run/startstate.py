"""A run's start state as the ledger keeps it: what its lane's checkouts were when it
began (their worktrees and each one's :class:`~prohost.engine.repos.changes.CheckoutState`),
as JSON, written with its agent's process group (§7). A run that a ``kill -9`` of the
harness interrupted is then reported by the next start with what it changed since
(§7 ``changes``), by the same code as any other ending
(:meth:`prohost.engine.run.checkouts.LaneCheckouts.changes`).

The bytes kept of the files an earlier turn left changed (for their line counts) are
not written: up to 16 MiB per checkout is no row for a ledger that fsyncs it before
the agent's output is read. A restarted run's report therefore counts the lines of
such a file as unknown (``null``), as it does for one too large to have been kept.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prohost.engine.repos.changes import CheckoutState, Seen
from prohost.engine.repos.gitcmd import GitPlaces
from prohost.engine.repos.worktrees import Checkout, CheckoutFailure, PreparedCheckouts

#: The layout's version: a start state written in another is not read (the run is
#: reported without ``changes``, and the log says why).
VERSION = 1


class UnreadableStartState(ValueError):
    """The ledger's start state is not one this prohost can read."""


def start_state(prepared: PreparedCheckouts, before: Sequence[CheckoutState],
                unready: Sequence[tuple[str, str]]) -> str:
    """The JSON the ledger keeps of a run's checkouts as it began."""
    first = None if prepared.first is None else prepared.checkouts.index(prepared.first)
    return json.dumps({
        "v": VERSION,
        "folder": None if prepared.folder is None else str(prepared.folder),
        "checkouts": [_checkout(c) for c in prepared.checkouts],
        "failures": [[f.source, f.reason] for f in prepared.failures],
        "first": first,
        "before": [_state(state) for state in before],
        "unready": [list(pair) for pair in unready],
    }, separators=(",", ":"))


def read_start_state(text: str) -> tuple[PreparedCheckouts, list[CheckoutState],
                                          list[tuple[str, str]]]:
    """The run's checkouts, their states and the checkouts no worktree was made of,
    as :func:`start_state` wrote them; raises :class:`UnreadableStartState`."""
    try:
        data = json.loads(text)
        if data.get("v") != VERSION:
            raise UnreadableStartState(f"a start state of layout {data.get('v')!r}, "
                                       f"not {VERSION}")
        checkouts = tuple(_checkout_of(c) for c in data["checkouts"])
        first = data["first"]
        prepared = PreparedCheckouts(
            folder=None if data["folder"] is None else Path(data["folder"]),
            checkouts=checkouts,
            failures=tuple(CheckoutFailure(str(s), str(r)) for s, r in data["failures"]),
            first=None if first is None else checkouts[first])
        before = [_state_of(state) for state in data["before"]]
        unready = [(str(name), str(why)) for name, why in data["unready"]]
    except UnreadableStartState:
        raise
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise UnreadableStartState(f"the start state cannot be read: {exc!r}") from exc
    return prepared, before, unready


def _places(git: GitPlaces | None) -> list[str] | None:
    return None if git is None else [git.work_tree, git.git_dir, git.common_dir]


def _places_of(value: Any) -> GitPlaces | None:
    if value is None:
        return None
    work_tree, git_dir, common_dir = value
    return GitPlaces(work_tree=str(work_tree), git_dir=str(git_dir),
                     common_dir=str(common_dir))


def _checkout(checkout: Checkout) -> dict[str, Any]:
    return {"name": checkout.name, "path": checkout.path, "source": checkout.source,
            "branch": checkout.branch, "unborn": checkout.unborn,
            "has_submodules": checkout.has_submodules, "git": _places(checkout.git)}


def _checkout_of(data: Mapping[str, Any]) -> Checkout:
    return Checkout(name=str(data["name"]), path=str(data["path"]),
                    source=str(data["source"]), branch=data["branch"],
                    unborn=bool(data["unborn"]), has_submodules=bool(data["has_submodules"]),
                    git=_places_of(data["git"]))


def _state(state: CheckoutState) -> dict[str, Any]:
    return {"repo": state.repo, "path": str(state.path), "commit": state.commit,
            "seen": None if state.seen is None
            else {name: [seen.head, seen.work] for name, seen in state.seen.items()},
            "error": state.error, "truncated": state.truncated, "git": _places(state.git),
            "ignored": sorted(state.ignored), "taken_at": state.taken_at}


def _state_of(data: Mapping[str, Any]) -> CheckoutState:
    seen = data["seen"]
    return CheckoutState(
        repo=str(data["repo"]), path=Path(data["path"]), commit=data["commit"],
        seen=None if seen is None
        else {str(name): Seen(head, work) for name, (head, work) in seen.items()},
        error=data["error"], truncated=data["truncated"], git=_places_of(data["git"]),
        ignored=frozenset(map(str, data["ignored"])), taken_at=float(data["taken_at"]))
