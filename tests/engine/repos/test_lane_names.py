"""Names a person can type for a conversation's worktrees and branch (issue 40,
point 5): ``prohost/alpha`` rather than ``prohost/conv-alpha-c31b…`` (20 hex), a
short suffix only where two conversations would collide, from ids that are
hostile input (they come from the wire); and the folders an earlier version named
keep being found, by the harness's records, with real git."""

from __future__ import annotations

import json
import re
import string
from pathlib import Path

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prohost.engine.repos.lanemarker import LANE_MARKER
from prohost.engine.repos.lanenames import MAX_NAME, NAMES_FILE, LaneNames, base_name
from prohost.engine.repos.worktrees import WorktreeManager, lane_folder_name
from tests.kits.repos import commit_file, git, make_repo, only

pytestmark = [pytest.mark.usefixtures("isolated_git"), pytest.mark.protocol("§5")]

#: What git and every filesystem take as one path component and a ref's part.
SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


def names_in(root: Path) -> LaneNames:
    return LaneNames(root, lambda folder: None)


def test_a_conversation_is_named_by_its_own_name() -> None:
    assert base_name("conv:alpha") == "alpha"
    assert base_name("conv:fix the login bug!") == "fix-the-login-bug"
    assert base_name("run:run_c35c9c9b2c5a") == "run_c35c9c9b2c5a"
    assert base_name("conv:../../etc") == "etc"
    assert base_name("conv:会話") == "conversation"  # nothing typeable left: a word
    assert base_name("conv:" + "x" * 500) == "x" * MAX_NAME


def test_only_a_collision_gets_a_suffix_and_names_are_kept(tmp_path: Path) -> None:
    root = tmp_path / "worktrees"
    names = names_in(root)
    assert names.name_for("conv:a b") == "a-b"
    clash = names.name_for("conv:a-b")
    assert re.fullmatch(r"a-b-[0-9a-f]{4}", clash)
    # One folder on macOS: App and app collide too.
    assert names.name_for("conv:App") == "App"
    assert re.fullmatch(r"app-[0-9a-f]{4}", names.name_for("conv:app"))
    # Recorded: a new harness (another process) gives each the same name, even
    # once the first conversation's folder and branch are long gone.
    again = names_in(root)
    assert [again.name_for(lane) for lane in ("conv:a-b", "conv:a b")] == [clash, "a-b"]
    assert json.loads((tmp_path / NAMES_FILE).read_text())["lanes"]["conv:a b"] == "a-b"
    # Forgotten (a run's folder and branch removed): the name is free again.
    again.forget("conv:a b")
    assert names_in(root).lookup("conv:a b") is None


def test_a_folder_already_there_is_never_given_to_another_lane(tmp_path: Path) -> None:
    root = tmp_path / "worktrees"
    (root / "alpha").mkdir(parents=True)  # no record names it: someone's all the same
    assert re.fullmatch(r"alpha-[0-9a-f]{4}", names_in(root).name_for("conv:alpha"))


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(
    st.text(max_size=80),
    st.text(alphabet=string.ascii_letters + " -_./:\\", max_size=12),
    st.sampled_from(["..", ".", "-", "_", "a", "A", "a-b", "a b", "HEAD", "x.lock"]),
), min_size=1, max_size=12, unique=True), st.sampled_from(["conv:", "run:", ""]))
def test_every_name_is_safe_distinct_and_stable(tmp_path_factory: pytest.TempPathFactory,
                                                ids: list[str], kind: str) -> None:
    root = tmp_path_factory.mktemp("names") / "worktrees"
    lanes = [kind + text for text in ids]
    names = names_in(root)
    given_names = [names.name_for(lane) for lane in lanes]
    for lane, name in zip(lanes, given_names, strict=True):
        # Hostile ids make only names git and every filesystem take as they are.
        assert SAFE.fullmatch(name), (lane, name)
        assert len(name) <= MAX_NAME + 1 + 20
        # Readable: the id's own name, or it with a short suffix where another
        # lane had it first.
        assert name == base_name(lane) or name.startswith(base_name(lane) + "-")
    assert len({name.casefold() for name in given_names}) == len(lanes)
    # The first lane always gets its name plain.
    assert given_names[0] == base_name(lanes[0])
    # Stable: asked again, by a new process, in another order.
    again = names_in(root)
    assert [again.name_for(lane) for lane in reversed(lanes)] == given_names[::-1]


async def test_a_worktree_an_earlier_version_named_keeps_its_folder_and_branch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Made with the old name (``conv-C1-<20 hex>``) and no record of names, as the
    version before this one left it: found by its folder's marker, used as it is,
    on its branch, with its commit; a new conversation gets a readable name."""
    with trio.fail_after(30):
        source = await make_repo(tmp_path / "app")
        home = tmp_path / "home"
        with monkeypatch.context() as old:
            old.setattr(LaneNames, "name_for", lambda self, lane: lane_folder_name(lane))
            manager = WorktreeManager(home, [source])
            path = only((await manager.prepare("conv:C1")).checkouts)
            prepared = await manager.prepare("conv:C1")
        assert path.parent.name == lane_folder_name("conv:C1")
        assert not (home / NAMES_FILE).exists()
        work = await commit_file(path, "a.txt", "turn 1\n")
        await manager.bring_back(prepared)

        manager = WorktreeManager(home, [source])
        again = await manager.prepare("conv:C1")
        assert again.failures == () and only(again.checkouts) == path
        old_branch = f"prohost/{lane_folder_name('conv:C1')}"
        assert again.checkouts[0].branch == old_branch
        assert (await git(path, "rev-parse", "HEAD")).strip() == work
        assert json.loads((home / NAMES_FILE).read_text())["lanes"] == {
            "conv:C1": lane_folder_name("conv:C1")}
        # Its marker is the record it was found by.
        assert json.loads((path.parent / LANE_MARKER).read_text())["lane"] == "conv:C1"
        fresh = await manager.prepare("conv:C2")
        assert only(fresh.checkouts).parent.name == "C2"
        assert fresh.checkouts[0].branch == "prohost/C2"
