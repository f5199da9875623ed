"""The macOS profile as text (sandbox-exec itself is not run on Linux CI)."""

from __future__ import annotations

from pathlib import Path

from prohost.engine.sandbox import Policy, seatbelt


def test_paths_are_quoted_with_backslashes_and_quotes_escaped() -> None:
    assert seatbelt.quote(Path('/Users/a "b"\\c')) == '"/Users/a \\"b\\"\\\\c"'
    text = seatbelt.profile(Policy(writable=(Path('/w/"q"'),)))
    assert '(allow file-write* (subpath "/w/\\"q\\""))' in text


def test_the_machine_is_read_only_and_writable_places_are_allowed_after() -> None:
    text = seatbelt.profile(Policy(writable=(Path("/home/u/work"), Path("/dev/null"))))
    assert text.splitlines() == [
        "(version 1)",
        "(allow default)",
        "(deny file-write*)",
        '(allow file-write* (subpath "/home/u/work"))',
        '(allow file-write* (subpath "/dev/null"))',
    ]


def test_hidden_places_are_denied_after_the_grants_and_grants_inside_them_win() -> None:
    policy = Policy(writable=(Path("/home/u/work"), Path("/home/u/.prohost/worktrees/a")),
                    readable=(Path("/home/u/.ssh/known_hosts"), Path("/opt/tools")),
                    hidden=(Path("/home/u/.ssh"), Path("/home/u/.prohost")))
    lines = seatbelt.profile(policy).splitlines()
    assert lines[3:] == [
        '(allow file-write* (subpath "/home/u/work"))',
        '(allow file-write* (subpath "/home/u/.prohost/worktrees/a"))',
        '(deny file-read* file-write* (subpath "/home/u/.ssh"))',
        '(deny file-read* file-write* (subpath "/home/u/.prohost"))',
        # Last match wins in SBPL: only grants inside a hidden place are said again.
        '(allow file-read* (subpath "/home/u/.ssh/known_hosts"))',
        '(allow file-read* file-write* (subpath "/home/u/.prohost/worktrees/a"))',
    ]


def test_a_hidden_place_inside_a_writable_one_stays_hidden_on_macos() -> None:
    # Unlike Landlock (which only adds), the profile's later deny wins here.
    lines = seatbelt.profile(Policy(writable=(Path("/home/u"),),
                                    hidden=(Path("/home/u/.ssh"),))).splitlines()
    assert lines[-1] == '(deny file-read* file-write* (subpath "/home/u/.ssh"))'
