"""What a run changed in each checkout of its lane: the §7 ``changes`` entries, the
shape (taking them is :mod:`prohost.engine.repos.changes`'s job).

An entry is either a :class:`CheckoutChanges` (``repo``, ``branch``, ``base``,
``head``, ``commits``, ``files``, ``more_files``: every key sent, ``null`` where
§7 says so; ``truncated`` only when the list was cut short) or an
:class:`UnreadableCheckout` (``repo`` and ``error`` only). A file's ``from`` is
sent only for a rename. The converter reads an entry back (from the ledger) by its
``error`` key.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from prohost.wire.protocol import converter

ChangeKind = Literal["added", "modified", "deleted", "renamed"]


@attrs.frozen
class FileChange:
    """One path whose content the run changed."""

    path: str
    change: ChangeKind
    #: Line counts; ``None`` for a binary file.
    added: int | None
    removed: int | None
    #: ``False`` when the path differs from ``head`` (the change is not committed).
    committed: bool
    #: A rename's old path (sent as ``from``).
    from_: str | None = None


@attrs.frozen
class CheckoutChanges:
    """One checkout compared with itself as the run began."""

    #: The checkout's folder name (never a local path).
    repo: str
    #: The worktree's branch at the end; ``None`` when detached.
    branch: str | None
    #: The worktree's commit when the run began (``None``: no commit yet) and ended.
    base: str | None
    head: str | None
    #: ``base..head``.
    commits: int
    #: Sorted by path, at most 100.
    files: list[FileChange]
    #: How many more files changed than ``files`` lists.
    more_files: int
    #: Why ``files`` stops short (the bound, or a file that could not be read);
    #: sent only then.
    truncated: str | None = None


@attrs.frozen
class UnreadableCheckout:
    """A checkout that could not be read (or had no private worktree), and why."""

    repo: str
    error: str


ChangeEntry = CheckoutChanges | UnreadableCheckout

converter.register_unstructure_hook(
    FileChange, make_dict_unstructure_fn(FileChange, converter, _cattrs_omit_if_default=True,
                                         from_=override(rename="from")))
converter.register_structure_hook(
    FileChange, make_dict_structure_fn(FileChange, converter, from_=override(rename="from")))

converter.register_unstructure_hook(
    CheckoutChanges, make_dict_unstructure_fn(CheckoutChanges, converter,
                                              truncated=override(omit_if_default=True)))


def _entry(data: Any, _: object) -> ChangeEntry:
    if isinstance(data, dict) and "error" in data:
        return converter.structure(data, UnreadableCheckout)
    return converter.structure(data, CheckoutChanges)


converter.register_structure_hook(ChangeEntry, _entry)
