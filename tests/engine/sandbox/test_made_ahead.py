"""A confinement made ahead (issue 29's cost): ``still_right`` says whether the same
policy would be given the same rules now, and it says no to every change that
would give other rules. The harness makes a run's rules while it is idle and uses
them only while they are still right (``prohost.engine.run.spares``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from prohost.engine.sandbox import Confinement, Policy, RuleCache, prepare
from prohost.engine.sandbox.confinement import prepare_anew
from tests.engine.sandbox.conftest import (
    DENIED_READ,
    SUPPORT,
    Home,
    aged,
    cached,
    needs_landlock,
    tried,
)

pytestmark = needs_landlock


def made_ahead(cache: RuleCache, policy: Policy) -> Confinement:
    """A confinement made for ``policy`` that is still right now: made again while
    a shared ``/`` or ``/tmp`` changes between the making and the check (it is one
    of the walk's folders), as the harness would."""
    for _ in range(5):
        confinement = prepare(policy, cached(cache))
        if confinement.still_right():
            return confinement
        confinement.close()
    raise AssertionError("nothing changed, yet the rules made ahead were never right")


@pytest.fixture
def settled(home: Home) -> Home:
    aged(home.root, home.root / ".config", home.root.parent)
    return home


CHANGES: dict[str, Callable[[Home], None]] = {
    # A new entry of a listed folder: the next run may read it.
    "a file made in the home": lambda home: (home.root / "later.txt").write_text("x"),
    # A hidden place that appears: it must not be readable.
    "a secret folder made": lambda home: (home.root / ".kube").mkdir(),
    # The same name, another folder: the rule is on the old one. (In a folder the
    # walk does not list: only the place's own check sees it.)
    "a writable place made again": lambda home: (
        (home.root / "src" / "deep").rename(home.root / "src" / "deep-old"),
        (home.root / "src" / "deep").mkdir()),
    # A grant that did not exist (a cache folder made since), there too.
    "a granted place that appears": lambda home: (home.root / "src" / "later").mkdir(),
    # A link to a hidden place retargeted: what it hides moves.
    "a hidden link retargeted": lambda home: (
        (home.root / ".gnupg").unlink(), (home.root / ".gnupg").symlink_to(home.root / "src")),
    # A link deeper down: the hidden place ~/.config/gh now resolves elsewhere.
    "a parent of a hidden place replaced by a link": lambda home: (
        (home.root / ".config").rename(home.root / "config-old"),
        (home.root / ".config").symlink_to(home.root / "original")),
}


def _policy(home: Home) -> Policy:
    # ~/src/later is missing until a change makes it, as a cache folder may be.
    return home.policy(writable=[home.root / "src" / "deep", home.root / "src" / "later"])


def watched(cache: RuleCache, policy: Policy) -> Confinement:
    """:func:`made_ahead`, watched for changes from then on."""
    for _ in range(5):
        confinement = made_ahead(cache, policy)
        if confinement.watch_for_changes() and confinement.unchanged():
            return confinement
        confinement.close()
    raise AssertionError("nothing changed, yet the watch never began quiet")


@pytest.mark.parametrize("how", ["stat", "watch"])
@pytest.mark.parametrize("change", list(CHANGES))
def test_a_change_makes_the_rules_made_ahead_out_of_date(
        settled: Home, cache: RuleCache, change: str, how: str) -> None:
    """Told by ``stat`` calls at the run's start, or by the watch begun when the
    rules were made (read without a syscall that could block)."""
    (settled.root / ".gnupg").symlink_to(settled.root / "original")
    (settled.root / "src" / "deep").mkdir()
    aged(settled.root, settled.root / "src")
    policy = _policy(settled)
    with (made_ahead if how == "stat" else watched)(cache, policy) as ahead:
        CHANGES[change](settled)
        if how == "stat":
            assert not ahead.still_right()
        else:
            assert ahead.unchanged() is False
            assert ahead.unchanged() is False  # once changed, always


def test_changes_that_leave_the_rules_as_they_are_leave_the_watch_quiet(
        settled: Home, cache: RuleCache) -> None:
    """The harness writes its status file beside its runs' folders and its ledger
    grows; the person edits a file in their home: none of it changes a grant, so
    none of it makes the next run's rules be made again."""
    with watched(cache, settled.policy()) as ahead:
        (settled.prohost / "status.json").write_text("{}\n")
        (settled.prohost / "status.json").rename(settled.prohost / "status.old")
        with (settled.root / "notes.txt").open("a") as notes:
            notes.write("an edit\n")
        (settled.root / "notes.txt").chmod(0o600)
        (settled.work / "made-by-a-run").write_text("x")
        assert ahead.unchanged() is True
        assert ahead.still_right()


def test_nothing_on_a_network_filesystem_is_watched(
        home: Home, cache: RuleCache, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another machine's changes to an NFS home never reach inotify: the rules are
    then checked with ``stat`` calls (``unchanged`` says it does not know)."""
    from prohost.engine.sandbox import cache as cache_module

    monkeypatch.setattr(cache_module, "is_local", lambda path: not path.startswith(
        str(home.root)))
    with made_ahead(cache, home.policy()) as ahead:
        assert not ahead.watch_for_changes()
        assert ahead.unchanged() is None


def test_rules_made_ahead_that_are_still_right_confine_as_new_ones(
        settled: Home, cache: RuleCache) -> None:
    later = settled.root / "later.txt"
    with made_ahead(cache, settled.policy()) as ahead:
        assert tried(ahead, "read", settled.root / "notes.txt") == "ok"
        assert tried(ahead, "write", settled.work / "out") == "ok"
        assert tried(ahead, "read", settled.root / ".ssh" / "id_ed25519") in DENIED_READ
        assert tried(ahead, "write", settled.original / "file") == "EACCES"
        # What made it out of date is exactly what its rules miss.
        later.write_text("made after the rules\n")
        assert not ahead.still_right()
        assert tried(ahead, "read", later) in DENIED_READ
    with prepare(settled.policy(), cached(cache)) as anew:
        assert tried(anew, "read", later) == "ok"


def test_rules_that_cannot_be_vouched_for_are_never_still_right(
        home: Home, cache: RuleCache) -> None:
    """Made without the cache, closed, or over a folder that had just changed when
    it was listed (its times' clock is coarse: see ``sandbox.cache``)."""
    with prepare_anew(home.policy(), SUPPORT) as uncached:
        assert not uncached.still_right()
    closed = made_ahead(cache, home.policy())
    closed.close()
    assert not closed.still_right()
    strict = RuleCache()  # the harness's: a folder changed < 2 s before is not trusted
    try:
        (home.root / "just-now").write_text("x")
        with prepare(home.policy(), cached(strict)) as recent:
            assert not recent.still_right()
    finally:
        strict.close()


def test_a_link_to_the_only_hidden_place_retargeted_is_seen(
        tmp_path: Path, cache: RuleCache) -> None:
    """The link's folder is none of the walk's (only the target's parents are), so
    only resolving the hidden places again sees it (as the cache does each run)."""
    root = tmp_path / "home"
    for vault in ("vault-a", "vault-b"):
        (tmp_path / vault).mkdir(parents=True)
        (tmp_path / vault / "id").write_text("PRIVATE KEY\n")
    root.mkdir()
    (root / ".ssh").symlink_to(tmp_path / "vault-a")
    aged(root, tmp_path)
    policy = Policy(hidden=(root / ".ssh",))
    with made_ahead(cache, policy) as ahead:
        (root / ".ssh").unlink()
        (root / ".ssh").symlink_to(tmp_path / "vault-b")
        assert not ahead.still_right()
        assert tried(ahead, "read", tmp_path / "vault-b" / "id") == "ok"
