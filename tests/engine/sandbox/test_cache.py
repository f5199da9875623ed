"""The rule cache (issue 29): kept rules are reused only while they are still right."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from prohost.engine.sandbox import Policy, RuleCache, Support, prepare
from prohost.engine.sandbox.cache import _signature
from prohost.engine.sandbox.policy import real_paths
from tests.engine.sandbox.conftest import DENIED_READ, Home, aged, cached, needs_landlock, tried


def attempt(support: Support, policy: Policy, op: str, path: Path) -> str:
    with prepare(policy, support) as confinement:
        return tried(confinement, op, path)


@needs_landlock
def test_unchanged_folders_are_not_listed_again_nor_granted_paths_opened_again(
        home: Home, cache: RuleCache) -> None:
    policy = home.policy()
    aged(home.root)
    prepare(policy, cached(cache)).close()
    assert cache.held > 10
    others = len(os.listdir("/proc/self/fd")) - cache.held
    for _ in range(3):  # /tmp may change under a shared machine: once is enough
        prepare(policy, cached(cache)).close()
    assert cache.walks_reused >= 1
    # Only the kept ones stay open (their number follows a shared /tmp's entries).
    assert len(os.listdir("/proc/self/fd")) - cache.held == others


@needs_landlock
def test_a_file_made_after_a_run_started_is_readable_by_the_next_run_only(
        home: Home, cache: RuleCache) -> None:
    policy = home.policy()
    aged(home.root)
    later = home.root / "later.txt"
    with prepare(policy, cached(cache)) as first:
        later.write_text("made after the first run started\n")
        assert tried(first, "read", later) in DENIED_READ
        assert tried(first, "read", home.root / "notes.txt") == "ok"
    assert attempt(cached(cache), policy, "read", later) == "ok"
    assert attempt(cached(cache), policy, "read", home.root / "notes.txt") == "ok"


@needs_landlock
def test_a_folder_that_becomes_a_hidden_place_is_hidden_from_the_next_run(
        tmp_path: Path, cache: RuleCache) -> None:
    # ~/keys is readable (a sibling of the missing ~/.ssh) and its descriptor is
    # kept; renamed to ~/.ssh it is the same folder, now hidden: a kept descriptor
    # reused for it would grant it.
    root = tmp_path / "home"
    (root / "keys").mkdir(parents=True)
    (root / "keys" / "id").write_text("PRIVATE KEY\n")
    (root / "work").mkdir()
    policy = Policy(writable=(root / "work",), hidden=(root / ".ssh",))
    aged(root)
    assert attempt(cached(cache), policy, "read", root / "keys" / "id") == "ok"
    (root / "keys").rename(root / ".ssh")
    assert attempt(cached(cache), policy, "read", root / ".ssh" / "id") in DENIED_READ
    (root / "later").mkdir()
    (root / "later" / "id").write_text("PRIVATE KEY\n")
    aged(root)
    assert attempt(cached(cache), policy, "read", root / "later" / "id") == "ok"
    (root / ".ssh").rename(root / "old-ssh")
    (root / "later").rename(root / ".ssh")
    assert attempt(cached(cache), policy, "read", root / ".ssh" / "id") in DENIED_READ
    assert attempt(cached(cache), policy, "read", root / "old-ssh" / "id") == "ok"


@needs_landlock
def test_a_retargeted_link_to_a_hidden_place_hides_its_new_target(
        tmp_path: Path, cache: RuleCache) -> None:
    root = tmp_path / "home"
    for vault in ("vault-a", "vault-b"):
        (root / vault).mkdir(parents=True)
        (root / vault / "id").write_text("PRIVATE KEY\n")
    (root / ".ssh").symlink_to(root / "vault-a")
    policy = Policy(hidden=(root / ".ssh",))
    aged(root)
    assert attempt(cached(cache), policy, "read", root / "vault-a" / "id") in DENIED_READ
    assert attempt(cached(cache), policy, "read", root / "vault-b" / "id") == "ok"
    (root / ".ssh").unlink()
    (root / ".ssh").symlink_to(root / "vault-b")
    assert attempt(cached(cache), policy, "read", root / "vault-b" / "id") in DENIED_READ
    assert attempt(cached(cache), policy, "read", root / "vault-a" / "id") == "ok"


@needs_landlock
def test_a_writable_place_made_again_is_granted_as_it_is_now(
        home: Home, cache: RuleCache) -> None:
    # Not a complement entry: its kept descriptor is checked against an lstat.
    policy = home.policy()
    assert attempt(cached(cache), policy, "write", home.work / "a") == "ok"
    (home.work / "a").unlink()
    home.work.rename(home.root / "work-old")
    home.work.mkdir()
    assert attempt(cached(cache), policy, "write", home.work / "b") == "ok"
    assert attempt(cached(cache), policy, "write", home.root / "work-old" / "c") != "ok"


@needs_landlock
def test_descriptors_are_bounded_and_closed(home: Home) -> None:
    fds = set(os.listdir("/proc/self/fd"))
    small = RuleCache(max_held=3)
    policy = home.policy()
    assert attempt(cached(small), policy, "read", home.root / "src" / "readme") == "ok"
    assert attempt(cached(small), policy, "write", home.worktree / "new") == "ok"
    assert small.held == 3
    small.close()
    assert small.held == 0
    assert set(os.listdir("/proc/self/fd")) == fds
    # Closed: preparations go on, made anew.
    assert attempt(cached(small), policy, "read", home.root / "src" / "readme") == "ok"
    assert small.held == 0


def test_paths_resolve_as_realpath_does(tmp_path: Path) -> None:
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "f").write_text("x")
    (tmp_path / "l1").symlink_to("a/b")
    (tmp_path / "l2").symlink_to(f"{tmp_path}/l1/c")
    (tmp_path / "a" / "b" / "up").symlink_to("../..")
    (tmp_path / "dangling").symlink_to("missing/x")
    (tmp_path / "loop1").symlink_to("loop2")
    (tmp_path / "loop2").symlink_to("loop1")
    (tmp_path / "l3").symlink_to("l1/../c")
    names = ["a", "l1", "l2", "l2/..", "l1/../a", "a/b/up", "a/b/up/l2/c/..", "dangling",
             "dangling/y", "loop1", "loop1/z", "f/x", "no/such", "l3", ".", "..",
             "l2/../../l1/c", "a/./b//c/", "l1"]
    paths = [f"{tmp_path}/{name}" for name in names]
    expected = list(dict.fromkeys(os.path.realpath(os.path.abspath(path)) for path in paths))
    assert real_paths(paths) == expected


def test_a_signature_changes_when_an_entry_is_added_removed_or_renamed(
        tmp_path: Path) -> None:
    aged(tmp_path)
    before = _signature(str(tmp_path))
    (tmp_path / "x").write_text("x")
    added = _signature(str(tmp_path))
    aged(tmp_path)
    before_rename = _signature(str(tmp_path))
    (tmp_path / "x").rename(tmp_path / "y")
    assert before != added
    assert before_rename != _signature(str(tmp_path))
    assert _signature(str(tmp_path / "missing")) is None


@needs_landlock
def test_a_folder_changed_just_before_it_was_listed_is_listed_again(home: Home) -> None:
    # Its times' clock is coarse: a second change in the same tick would not show,
    # so a walk over a folder that has just changed is never reused.
    fresh = RuleCache()
    try:
        (home.root / "just-now").write_text("x")
        prepare(home.policy(), cached(fresh)).close()
        prepare(home.policy(), cached(fresh)).close()
        assert (fresh.walks_made, fresh.walks_reused) == (2, 0)
    finally:
        fresh.close()


@needs_landlock
def test_at_most_a_quarter_of_the_descriptor_limit_is_held(
        home: Home, monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda which: (12, 4096))
    small = RuleCache()
    monkeypatch.undo()
    try:
        assert attempt(cached(small), home.policy(), "read", home.root / "src" / "readme") == "ok"
        assert small.held == 3
    finally:
        small.close()
