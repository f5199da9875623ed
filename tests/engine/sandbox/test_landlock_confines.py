"""A child started with the Landlock fallback's confinement (Landlock's filesystem
rules alone, where bubblewrap cannot run): what it may write, read and run."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prohost.engine.sandbox import Policy
from tests.kits.sandbox import DENIED_READ, Confiner, Home, needs_landlock

pytestmark = needs_landlock

DENIED_WRITE = {"EACCES", "EPERM", "EROFS"}


def test_writes_its_places_and_nothing_else(home: Home, confine: Confiner) -> None:
    policy = home.policy()
    assert confine.attempt(policy, "write", home.work / "new") == "ok"
    assert confine.attempt(policy, "write", home.worktree / "new") == "ok"
    assert confine.attempt(policy, "write", home.root / "notes.txt") in DENIED_WRITE
    assert confine.attempt(policy, "write", home.root / "brand-new") in DENIED_WRITE
    assert confine.attempt(policy, "write", home.original / "file") in DENIED_WRITE
    assert confine.attempt(policy, "write", home.prohost / "credentials.json") in DENIED_WRITE
    assert (home.original / "file").read_text() == "original\n"


def test_hidden_places_cannot_be_read_the_rest_can(home: Home, confine: Confiner) -> None:
    policy = home.policy()
    assert confine.attempt(policy, "read", home.root / ".ssh" / "id_ed25519") in DENIED_READ
    assert confine.attempt(policy, "read", home.root / ".aws" / "credentials") in DENIED_READ
    assert confine.attempt(policy, "read", home.root / ".config" / "gh" / "hosts.yml") \
        in DENIED_READ
    assert confine.attempt(policy, "read", home.prohost / "credentials.json") in DENIED_READ
    assert confine.attempt(policy, "list", home.prohost) in DENIED_READ
    assert confine.attempt(policy, "read", home.root / "notes.txt") == "ok"
    assert confine.attempt(policy, "read", home.root / "src" / "readme") == "ok"
    assert confine.attempt(policy, "read", Path("/etc/passwd")) == "ok"


def test_a_shell_runs_programs_and_its_grandchildren_are_confined(
        home: Home, confine: Confiner) -> None:
    done = confine.run(home.policy(), f"""
        ls /bin > /dev/null && echo ran-ls
        cat {home.root}/src/readme
        sh -c 'echo grandchild > {home.root}/from-grandchild' || echo grandchild-denied
        sh -c 'cat {home.root}/.ssh/id_ed25519' || echo grandchild-cannot-read
        sh -c 'echo fine > {home.work}/from-grandchild' && echo grandchild-wrote-work
    """)
    assert done.stdout.split() == ["ran-ls", "readable", "grandchild-denied",
                                   "grandchild-cannot-read", "grandchild-wrote-work"]
    assert not (home.root / "from-grandchild").exists()
    assert (home.work / "from-grandchild").read_text() == "fine\n"


def test_a_readable_grant_inside_a_hidden_place_opens_exactly_it(
        home: Home, confine: Confiner) -> None:
    policy = home.policy(readable=[home.root / ".ssh" / "known_hosts"])
    assert confine.attempt(policy, "read", home.root / ".ssh" / "known_hosts") == "ok"
    assert confine.attempt(policy, "read", home.root / ".ssh" / "id_ed25519") in DENIED_READ
    assert confine.attempt(policy, "write", home.root / ".ssh" / "known_hosts") in DENIED_WRITE
    folder = home.policy(readable=[home.root / ".ssh"])
    assert confine.attempt(folder, "read", home.root / ".ssh" / "id_ed25519") == "ok"
    assert confine.attempt(folder, "read", home.root / ".aws" / "credentials") in DENIED_READ


def test_a_link_never_widens_a_grant(home: Home, confine: Confiner) -> None:
    # A link to a hidden folder in a readable place, one in a writable place, and
    # a link beside the folder that holds the harness's home.
    (home.root / "src" / "keys").symlink_to(home.root / ".ssh")
    (home.work / "keys").symlink_to(home.root / ".ssh")
    (home.root / "ph").symlink_to(home.prohost)
    policy = home.policy()
    assert confine.attempt(policy, "read", home.root / "src" / "keys" / "id_ed25519") in DENIED_READ
    assert confine.attempt(policy, "read", home.work / "keys" / "id_ed25519") in DENIED_READ
    assert confine.attempt(policy, "write", home.work / "keys" / "planted") in DENIED_WRITE
    assert confine.attempt(policy, "read", home.root / "ph" / "credentials.json") in DENIED_READ


def test_a_hidden_place_given_as_a_link_hides_its_target(home: Home, confine: Confiner) -> None:
    # Dotfile managers link ~/.ssh into their own folder.
    dotfiles = home.root / "dotfiles" / "ssh"
    dotfiles.mkdir(parents=True)
    (dotfiles / "id_rsa").write_text("PRIVATE\n")
    shutil.rmtree(home.root / ".ssh")
    (home.root / ".ssh").symlink_to(dotfiles)
    policy = home.policy()
    assert confine.attempt(policy, "read", dotfiles / "id_rsa") in DENIED_READ
    assert confine.attempt(policy, "read", home.root / ".ssh" / "id_rsa") in DENIED_READ


def test_devices_and_inherited_pipes_are_writable(home: Home, confine: Confiner) -> None:
    done = confine.run(home.policy(), """
        echo x > /dev/null && echo null-ok
        echo to-stderr >&2
        echo via-dev-stdout > /dev/stdout
        head -c 4 /dev/zero | wc -c
    """)
    assert done.stdout.split() == ["null-ok", "via-dev-stdout", "4"]
    assert done.stderr == "to-stderr\n"


def test_git_commits_in_a_writable_repository(home: Home, confine: Confiner) -> None:
    repo = home.work / "repo"
    env = {**os.environ, "HOME": str(home.root), "GIT_CONFIG_GLOBAL": "/dev/null",
           "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b",
           "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@b"}
    subprocess.run(["git", "init", "-q", str(repo)], check=True, env=env)
    done = confine.run(home.policy(), """
        echo hello > file && git add file && git commit -qm first && git log --format=%s
    """, cwd=repo, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "first\n"


def test_a_new_entry_in_a_walked_folder_is_seen_by_the_next_run_only(
        home: Home, confine: Confiner) -> None:
    policy = home.policy()
    with confine(policy) as confinement:
        (home.root / "later.txt").write_text("later\n")
        done = subprocess.run(["cat", str(home.root / "later.txt")], capture_output=True,
                              text=True, preexec_fn=confinement.preexec, check=False)
    assert done.returncode != 0
    assert "Permission denied" in done.stderr
    assert confine.attempt(policy, "read", home.root / "later.txt") == "ok"


def test_a_missing_hidden_place_stays_hidden_when_made_later(home: Home, confine: Confiner) -> None:
    policy = home.policy(hidden=[home.root / ".kube"])
    with confine(policy) as confinement:
        (home.root / ".kube").mkdir()
        (home.root / ".kube" / "config").write_text("secret\n")
        done = subprocess.run(["cat", str(home.root / ".kube" / "config")],
                              capture_output=True, text=True,
                              preexec_fn=confinement.preexec, check=False)
    assert done.returncode != 0


def test_a_missing_writable_place_is_skipped(home: Home, confine: Confiner) -> None:
    policy = home.policy(writable=[home.root / "not-yet"])
    assert confine.attempt(policy, "write", home.work / "new") == "ok"
    (home.root / "not-yet").mkdir()
    assert confine.attempt(Policy(writable=(home.work,)), "write", home.root / "not-yet" / "f") \
        in DENIED_WRITE


def test_a_failure_in_the_child_fails_the_spawn_never_runs_unconfined(
        home: Home, confine: Confiner) -> None:
    marker = home.root / "ran-unconfined"
    confinement = confine(home.policy())
    preexec = confinement.preexec
    confinement.close()  # the ruleset's descriptor is gone: restrict_self fails (EBADF)
    with pytest.raises(subprocess.SubprocessError, match="preexec_fn"):
        subprocess.run(["sh", "-c", f"touch {marker}"], preexec_fn=preexec, check=False)
    assert not marker.exists()


def test_the_ruleset_descriptor_does_not_reach_the_program(home: Home, confine: Confiner) -> None:
    with confine(home.policy()) as confinement:
        assert confinement.argv_prefix == ()
        done = subprocess.run([sys.executable, "-I", "-S", "-c",
                               "import os; print(sorted(os.listdir('/proc/self/fd')))"],
                              preexec_fn=confinement.preexec, capture_output=True, text=True,
                              check=True)
    assert done.stdout.strip() == "['0', '1', '2', '3']"  # 3: listdir's own descriptor


def test_a_spawn_is_confined_and_the_rest_is_not(
        home: Home, confine: Confiner) -> None:
    marker = home.root / "from-thread"
    with confine(home.policy()) as confinement:
        done = confinement.spawn(lambda: subprocess.run(
            ["sh", "-c", f"echo x > {marker} || echo denied; cat {home.root}/.ssh/id_ed25519"
                         f" || echo hidden; echo y > {home.work}/from-thread && echo wrote"],
            capture_output=True, text=True, check=False))
    assert done.stdout.split() == ["denied", "hidden", "wrote"]
    assert not marker.exists()
    # This process (and its next thread) is not confined.
    marker.write_text("still free\n")
    assert (home.root / ".ssh" / "id_ed25519").read_text() == "PRIVATE KEY\n"


def test_a_confined_thread_that_cannot_enter_the_domain_never_spawns(
        home: Home, confine: Confiner) -> None:
    confinement = confine(home.policy())
    ruleset = confinement._ruleset
    assert ruleset is not None
    os.close(ruleset.fd)  # the kernel will refuse restrict_self: EBADF
    spawned: list[bool] = []
    with pytest.raises(OSError) as caught:
        confinement.spawn(lambda: spawned.append(True))
    assert caught.value.errno == 9  # EBADF
    assert spawned == []
    ruleset.fd = -1


def test_a_writable_file_is_written_in_place_not_replaced_beside(
        home: Home, confine: Confiner) -> None:
    config = home.root / ".agent.json"
    config.write_text("{}\n")
    policy = home.policy(writable=[config])
    assert confine.attempt(policy, "write", config) == "ok"
    assert confine.attempt(policy, "write", home.root / ".agent.json.tmp") in DENIED_WRITE


def test_a_grant_named_through_a_link_is_made_on_its_target(home: Home, confine: Confiner) -> None:
    (home.root / "work-link").symlink_to(home.work)
    policy = Policy(writable=(home.root / "work-link",), hidden=(home.root / ".ssh",))
    assert policy.resolved().writable == (home.work,)
    assert confine.attempt(policy, "write", home.work / "through-link") == "ok"
    assert confine.attempt(policy, "write", home.root / "notes.txt") in DENIED_WRITE


def test_a_grant_that_cannot_be_looked_up_refuses_the_confinement_every_way(
        home: Home, confine: Confiner) -> None:
    # A lookup that fails otherwise than "no such file" (here a name longer than
    # any; a loop of links or a folder without search permission fail the same
    # way): the harness's cache never dropped such a grant silently, and the
    # uncached preparation (its fallback) now resolves and grants as it does.
    policy = home.policy(writable=[home.root / ("x" * 300)])
    with pytest.raises(OSError) as caught:
        confine(policy).close()
    assert caught.value.errno == errno.ENAMETOOLONG
