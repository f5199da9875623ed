"""What the complement walk grants, and the default lists' shape."""

from __future__ import annotations

from pathlib import Path

from prohost.engine.sandbox import Policy, defaults
from prohost.engine.sandbox.confinement import complement


def readable_rest(real: Policy) -> list[Path]:
    """What the walk grants for ``real``'s hidden places, as paths."""
    return [Path(path) for path in complement([str(place) for place in real.hidden])]


def test_without_hidden_places_everything_is_readable() -> None:
    assert readable_rest(Policy().resolved()) == [Path("/")]


def test_the_walk_grants_siblings_on_the_way_never_ancestors_hidden_or_links(
        tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / "src").mkdir()
    (home / "notes").write_text("n")
    (home / "keys").symlink_to(home / ".ssh")
    (home / ".config" / "gh").mkdir(parents=True)
    (home / ".config" / "git").mkdir()
    rest = readable_rest(Policy(hidden=(home / ".ssh", home / ".config" / "gh")).resolved())
    assert {path for path in rest if path.parent == home} == {home / "src", home / "notes"}
    assert home / ".config" / "git" in rest
    for kept_out in (home, home / ".ssh", home / "keys", home / ".config",
                     home / ".config" / "gh", Path("/"), tmp_path):
        assert kept_out not in rest


def test_a_missing_hidden_place_still_walks_its_existing_parents(tmp_path: Path) -> None:
    (tmp_path / "other").mkdir()
    rest = readable_rest(Policy(hidden=(tmp_path / "missing" / "deeper",)).resolved())
    assert tmp_path / "other" in rest
    assert tmp_path not in rest


def test_default_lists_are_relative_to_the_home_and_devices_absolute() -> None:
    home = Path("/home/u")
    assert all(not Path(name).is_absolute() for name in defaults.SECRETS)
    assert all(not Path(name).is_absolute() for name in defaults.CACHE_VARIABLES.values())
    assert home / ".ssh" in defaults.secrets(home)
    assert Path("/dev/null") in defaults.devices()
    assert all(path.is_absolute() for path in defaults.devices())
