"""What a run leaves behind cannot reach the person (docs/protocol.md §13, issue 36):
the agent CLIs' folders and the caches a run writes are the harness's own, a grant
never passes through a link planted where a run may write, and Codex's setup copies
nothing reached through a link into a hidden place.

Each test is a hostile run through the real harness and reference server, judged by
files outside the run (read and stat'ed by the test), never by the agent's word.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest
import trio

from prohost.engine.sandbox import probe
from tests.kits.confinement import (
    PROBER,
    World,
    prober,
    results,
    turn,
    world_fixture,  # noqa: F401 (a fixture)
)
from tests.kits.harness import finished, running_harness, running_server
from tests.kits.no_sandbox import without_bubblewrap
from tests.kits.paths import AGENTS

pytestmark = [
    pytest.mark.protocol("§13"),
    pytest.mark.skipif(probe().kind is None,
                       reason=f"this system cannot confine: {probe().reason}"),
]

FAKE_ACP = AGENTS / "fake_acp.py"
#: What a refused read or write may fail with (§13): Landlock alone says EACCES,
#: bubblewrap's read-only view EROFS and its empty hidden places ENOENT.
DENIED_READ = {"EACCES", "ENOENT"}
DENIED_WRITE = {"EACCES", "EPERM", "EROFS"}
FAKE_CODEX = AGENTS / "fake_codex.py"


@pytest.fixture(autouse=True, params=["strongest", "landlock"])
def confinement(request: pytest.FixtureRequest, world: World,
                monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test under the strongest confinement here (bubblewrap where it runs) and
    under Landlock alone, the fallback: what a run leaves behind must not reach the
    person under either."""
    if request.param == "landlock":
        if probe().kind not in ("bwrap", "landlock"):
            pytest.skip("this system cannot confine with Landlock")
        without_bubblewrap(monkeypatch)
    return str(request.param)


def snapshot(paths: list[Path]) -> dict[Path, tuple[bytes, int, int]]:
    """Each file's content, mode and modification time: what a later write would change."""
    out = {}
    for path in paths:
        info = os.stat(path)
        out[path] = (path.read_bytes(), info.st_mode, info.st_mtime_ns)
    return out


async def test_a_plain_run_cannot_write_the_person_s_cli_folders_caches_or_dotfiles(
    world: World,
) -> None:
    """Attack 10: hooks in ``~/.claude/settings.json``, ``~/.claude.json``, Codex's
    config, a cache entry and ``~/.bashrc`` would all run later, unconfined, in the
    person's own sessions and builds. Every write is refused; nothing changed."""
    user = world.user
    targets = [user / ".claude" / "settings.json", user / ".claude.json",
               user / ".codex" / "config.toml", user / ".cache" / "x", user / ".bashrc"]
    for target in targets:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("the person's own\n")
    before = snapshot(targets)
    tool = prober(*(f"write:{index}:{target}" for index, target in enumerate(targets)),
                  f"write:new_cache:{user / '.cache' / 'planted'}",
                  f"write:new_claude:{user / '.claude' / 'hooks.json'}")
    with trio.fail_after(60):
        async with running_server() as server, world.harness(server, tool):
            completion = await turn(server, "A")
    said = results(completion)
    assert all(result != "ok" for result in said.values()), said
    assert snapshot(targets) == before
    assert not (user / ".cache" / "planted").exists()
    assert not (user / ".claude" / "hooks.json").exists()


def opencode_wrapper(world: World) -> str:
    """An ``opencode acp`` command (so the harness takes it for OpenCode) whose
    program first tries to read ``~/.ssh/id_rsa`` and write ``~/.bashrc``, writing
    what happened into the logs folder, then speaks ACP as the fake agent does."""
    folder = world.tmp / "bin"
    folder.mkdir(exist_ok=True)
    wrapper = folder / "opencode"
    probe_line = shlex.join([sys.executable, str(PROBER),
                             f"read:ssh:{world.user / '.ssh' / 'id_rsa'}",
                             f"write:bashrc:{world.user / '.bashrc'}"])
    wrapper.write_text(
        "#!/bin/sh\n"
        f"{probe_line} > {shlex.quote(str(world.logs / 'opencode-probe.txt'))}\n"
        f"exec {shlex.quote(sys.executable)} {shlex.quote(str(FAKE_ACP))}\n")
    wrapper.chmod(0o755)
    return f"{shlex.quote(str(wrapper))} acp"


def probed(world: World) -> dict[str, str]:
    text = (world.logs / "opencode-probe.txt").read_text()
    return dict(line.split("=", 1) for line in text.splitlines())


async def test_a_link_a_run_plants_in_a_cache_never_widens_a_later_agent_s_grant(
    world: World,
) -> None:
    """Attack 3: a plain run makes ``~/.cache/opencode`` a link to ``$HOME``; the
    next OpenCode run must not read ``~/.ssh`` nor write ``~/.bashrc`` through it."""
    world.logs.mkdir(parents=True, exist_ok=True)
    (world.user / ".ssh" / "id_rsa").write_text("the person's key\n")
    (world.user / ".bashrc").write_text("the person's rc\n")
    (world.user / ".cache").mkdir()
    plant = ("import os, sys\n"
             "try:\n"
             f"    os.symlink({str(world.user)!r}, {str(world.user / '.cache' / 'opencode')!r})\n"
             "    print('planted')\n"
             "except OSError as exc:\n"
             "    print('refused', exc.errno)\n")
    script = world.tmp / "plant.py"
    script.write_text(plant)
    with trio.fail_after(90):
        async with running_server() as server:
            async with world.harness(server, shlex.join([sys.executable, str(script)])):
                first = await turn(server, "A")
            assert first["ok"] is True, first
            assert first["reply"].startswith("refused"), first["reply"]  # ~/.cache is not its
            async with running_harness(server, world.home, exec_command=opencode_wrapper(world),
                                       brain="acp", env=world.env):
                second = await turn(server, "B")
    assert second["ok"] is True, second
    said = probed(world)
    assert said["ssh"] in DENIED_READ and said["bashrc"] in DENIED_WRITE, said
    assert (world.user / ".bashrc").read_text() == "the person's rc\n"


async def test_a_link_in_the_harness_s_own_agent_folder_fails_the_run_before_it_starts(
    world: World,
) -> None:
    """The harness's own folder for OpenCode, with one of its parts made a link to
    ``$HOME`` (as a run that could write there would): no grant passes through it;
    the run fails saying so, its agent never started."""
    world.logs.mkdir(parents=True, exist_ok=True)
    (world.user / ".ssh" / "id_rsa").write_text("the person's key\n")
    command = opencode_wrapper(world)
    with trio.fail_after(90):
        async with running_server() as server:
            async with running_harness(server, world.home, exec_command=command,
                                       brain="acp", env=world.env):
                first = await turn(server, "A")
            assert first["ok"] is True, first
            owned = world.home / "agents" / "opencode"
            cache = next(path for path in owned.rglob("opencode") if path.parent.name == ".cache")
            cache.rmdir()
            cache.symlink_to(world.user)
            (world.logs / "opencode-probe.txt").unlink()
            async with running_harness(server, world.home, exec_command=command,
                                       brain="acp", env=world.env):
                second = await turn(server, "A")
    assert second["ok"] is False
    assert "symbolic link" in second["error"], second["error"]
    assert str(world.user) not in second["error"]  # §7: no local path on the wire
    assert not (world.logs / "opencode-probe.txt").exists()


async def test_codex_s_setup_never_copies_a_linked_secret_into_a_run(world: World) -> None:
    """Attack 7: ``config.toml`` of Codex's folder made a link to
    ``~/.cargo/credentials.toml`` (the person's, and the harness's own folder the
    run could write): a later Codex run with an MCP server never gets the token in
    its CODEX_HOME."""
    token = "cio-publish-token-0123456789"
    cargo = world.user / ".cargo"
    cargo.mkdir()
    (cargo / "credentials.toml").write_text(f'[registry]\ntoken = "{token}"\n')
    (world.user / ".codex").mkdir()
    (world.user / ".codex" / "config.toml").symlink_to(cargo / "credentials.toml")
    world.logs.mkdir(parents=True, exist_ok=True)
    seen = world.logs / "codex-home-config.toml"
    env = dict(world.env)
    env["FAKE_AGENT_TOOL"] = f'cat "$CODEX_HOME/config.toml" > {shlex.quote(str(seen))}; echo done'
    command = shlex.join([sys.executable, str(FAKE_CODEX)])
    mcp = {"url": "https://mcp.example/mcp", "token": "run-token-abcdef"}
    with trio.fail_after(90):
        async with running_server() as server, running_harness(
            server, world.home, exec_command=command, brain="codex", env=env,
        ) as running:
            first_id = await server.submit_run("probe", conversation_id="A", mcp=mcp)
            await server.wait_until(finished(first_id))
            first_seen = seen.read_text() if seen.exists() else ""
            assert token not in first_seen  # the person's linked config was not read
            # The conversation's own folder of the harness's: made a link by a run
            # (simulated here); the conversation's next run.
            lanes = Path(running.harness.options.home) / "cli" / "default" / "lanes"
            owned, = (lane / "codex" for lane in lanes.iterdir())
            assert owned.is_dir()
            config = owned / "config.toml"
            config.unlink(missing_ok=True)
            config.symlink_to(cargo / "credentials.toml")
            seen.unlink(missing_ok=True)
            second_id = await server.submit_run("probe", conversation_id="A", mcp=mcp)
            await server.wait_until(finished(second_id))
            first = server.run(first_id).completion
            second = server.run(second_id).completion
    assert first is not None and first["ok"] is True, first
    assert second is not None
    if seen.exists():
        assert token not in seen.read_text()
    else:
        assert second["ok"] is False and "link" in second["error"], second
    assert json.dumps(second).find(token) == -1


REFRESHER = """
import json, os, sys
folder = os.environ["CLAUDE_SECURESTORAGE_CONFIG_DIR"]
path = os.path.join(folder, ".credentials.json")
with open(path) as handle:
    doc = json.load(handle)
seen = doc["claudeAiOauth"]["refreshToken"]
doc["claudeAiOauth"].update(refreshToken="r2", accessToken="a2", expiresAt=2000)
# As Claude Code writes it: a temporary file, then a rename.
with open(path + ".tmp", "w") as handle:
    json.dump(doc, handle)
os.replace(path + ".tmp", path)
print(folder, seen)
"""


async def test_the_default_account_s_claude_folder_is_the_harness_s_and_shares_the_login(
    world: World,
) -> None:
    """Claude Code's login store (``CLAUDE_SECURESTORAGE_CONFIG_DIR``, shared by
    every conversation of the account, apart from each one's CLAUDE_CONFIG_DIR) is
    a folder of the harness's own, seeded with the person's login; a refresh the
    run makes (rotating the refresh token) reaches the person's file when the run
    ends, so neither logs the other out; nothing else of the run's folders reaches
    the person's."""
    person = world.user / ".claude"
    person.mkdir()
    login = {"claudeAiOauth": {"accessToken": "a1", "refreshToken": "r1", "expiresAt": 1000,
                               "scopes": ["user:inference"], "subscriptionType": "max"}}
    (person / ".credentials.json").write_text(json.dumps(login))
    script = world.tmp / "refresher.py"
    script.write_text(REFRESHER)
    env = dict(world.env)
    env["FAKE_AGENT_TOOL"] = shlex.join([sys.executable, str(script)])
    command = shlex.join([sys.executable, str(AGENTS / "fake_claude.py")])
    with trio.fail_after(60):
        async with running_server() as server, running_harness(
            server, world.home, exec_command=command, brain="claude", env=env,
        ):
            completion = await turn(server, "A")
    assert completion["ok"] is True, completion
    owned = world.home / "cli" / "default" / "login" / "claude"
    assert completion["reply"] == f"{owned} r1"
    shared = json.loads((person / ".credentials.json").read_text())
    assert shared["claudeAiOauth"]["refreshToken"] == "r2"
    assert os.listdir(person) == [".credentials.json"]


async def test_a_confined_agent_gets_the_harness_s_caches_and_none_of_the_person_s_sockets(
    world: World,
) -> None:
    """The agent's environment, as the agent itself sees it: tools pointed at the
    harness's caches, and no variable that names ssh-agent, tmux or the session
    bus, unless ``--allow-write`` names the socket (§13)."""
    sockets = world.tmp / "sockets"
    sockets.mkdir()
    env = dict(world.env)
    env.update(SSH_AUTH_SOCK=str(sockets / "agent.1"), TMUX="/tmp/tmux-1000/default,1,0",
               TMUX_PANE="%1", DBUS_SESSION_BUS_ADDRESS="unix:path=/run/user/1000/bus",
               MAVEN_OPTS="-Xmx1g")
    command = shlex.join([sys.executable, str(AGENTS / "env_dump.py")])
    with trio.fail_after(60):
        async with running_server() as server:
            async with running_harness(server, world.home, exec_command=command,
                                       brain="plain", env=env):
                first = await turn(server, "A")
            async with running_harness(server, world.home, exec_command=command,
                                       brain="plain", env=env,
                                       allow_write=(world.logs, sockets)):
                second = await turn(server, "B")
    seen = json.loads(first["reply"])["env"]
    assert not {"SSH_AUTH_SOCK", "TMUX", "TMUX_PANE", "DBUS_SESSION_BUS_ADDRESS"} & set(seen)
    caches = world.home / "cache"
    assert seen["XDG_CACHE_HOME"] == str(caches / "xdg")
    assert seen["npm_config_cache"] == str(caches / "npm")
    assert seen["CARGO_HOME"] == str(caches / "cargo")
    assert seen["MAVEN_OPTS"] == f"-Xmx1g -Dmaven.repo.local={caches / 'm2'}"
    assert "CLAUDE_CONFIG_DIR" not in seen and "CODEX_HOME" not in seen  # plain: no CLI folder
    allowed = json.loads(second["reply"])["env"]
    assert allowed["SSH_AUTH_SOCK"] == str(sockets / "agent.1")
    assert "TMUX" not in allowed


def settings_reader(world: World, program: str, script: str) -> str:
    """An ACP command whose program is named ``program`` (so the harness takes it
    for that agent), runs ``script`` (sh) with its output into the logs folder,
    then speaks ACP as the fake agent does."""
    folder = world.tmp / "bin"
    folder.mkdir(exist_ok=True)
    wrapper = folder / program
    wrapper.write_text(
        "#!/bin/sh\n"
        f"( {script} ) > {shlex.quote(str(world.logs / 'seen.txt'))} 2>&1\n"
        f"exec {shlex.quote(sys.executable)} {shlex.quote(str(FAKE_ACP))}\n")
    wrapper.chmod(0o755)
    return shlex.quote(str(wrapper)) + (" acp" if program == "opencode" else "")


async def test_an_acp_agent_sees_the_person_s_settings_and_login_and_writes_only_its_own(
    world: World, confinement: str,
) -> None:
    """OpenCode's settings and login are the person's (``~/.config/opencode``,
    ``~/.local/share/opencode``): a run sees both; what it writes or changes there
    never reaches the person's folders (checked on disk); under bubblewrap the
    conversation's next run sees what the earlier one wrote (the harness keeps it),
    and another conversation does not (each has the harness's folder of its own)."""
    world.logs.mkdir(parents=True, exist_ok=True)
    config = world.user / ".config" / "opencode"
    data = world.user / ".local" / "share" / "opencode"
    config.mkdir(parents=True)
    data.mkdir(parents=True)
    (config / "opencode.json").write_text('{"provider": "the person\'s"}\n')
    (data / "auth.json").write_text('{"mock": "the person\'s key"}\n')
    before = snapshot([config / "opencode.json", data / "auth.json"])
    script = (f"cat {config}/opencode.json {data}/auth.json; cat {config}/run.txt; "
              f"echo the run\\'s > {config}/run.txt; "
              f"echo changed > {config}/opencode.json; rm -f {data}/auth.json")
    command = settings_reader(world, "opencode", script)
    with trio.fail_after(90):
        async with running_server() as server, running_harness(
            server, world.home, exec_command=command, brain="acp", env=world.env,
        ):
            first = await turn(server, "A")
            seen_first = (world.logs / "seen.txt").read_text()
            second = await turn(server, "A")
            seen_second = (world.logs / "seen.txt").read_text()
            other = await turn(server, "B")
            seen_other = (world.logs / "seen.txt").read_text()
    assert first["ok"] is True and second["ok"] is True, (first, second)
    assert other["ok"] is True, other
    # Another conversation sees the person's folders as they are, nothing of A's.
    assert seen_other == seen_first, (seen_first, seen_other)
    assert seen_first.startswith('{"provider": "the person\'s"}\n{"mock": "the person\'s key"}\n')
    # The person's folders: as they were, nothing added.
    assert snapshot([config / "opencode.json", data / "auth.json"]) == before
    assert sorted(os.listdir(config)) == ["opencode.json"]
    assert sorted(os.listdir(data)) == ["auth.json"]
    if confinement == "landlock":
        # Without a mount namespace the person's folders are read-only to the run.
        assert "the run's" not in seen_second and "changed" not in seen_second
        return
    # The earlier run's writes (a new file, a changed one, a removed one) are kept.
    assert "changed\n" in seen_second and "the run's\n" in seen_second, seen_second
    assert "the person's key" not in seen_second
    # The conversation's own upper folder (one per lane: no conversation reads
    # another's sessions, no two runs at once share an overlay's upper).
    uppers = [lane / ".config" / "opencode" / "run.txt"
              for lane in (world.home / "agents" / "opencode").iterdir()]
    assert sorted(upper.read_text() for upper in uppers) == ["the run's\n"] * 2


@pytest.mark.parametrize("brain", ["codex", "acp"])
async def test_codex_s_folder_is_seeded_with_the_person_s_config(
    world: World, brain: str,
) -> None:
    """Codex (``--brain codex`` and codex-acp) runs with the harness's CODEX_HOME
    seeded with the person's ``config.toml`` (the model provider): one way, again
    when the person's is newer; what a run writes there never reaches the person's."""
    world.logs.mkdir(parents=True, exist_ok=True)
    person = world.user / ".codex"
    person.mkdir()
    (person / "config.toml").write_text('model_provider = "mock"\n')
    script = ('cat "$CODEX_HOME/config.toml"; '
              'echo "notify = [\\"planted\\"]" >> "$CODEX_HOME/config.toml"')
    env = dict(world.env)
    if brain == "codex":
        seen = world.logs / "seen.txt"
        env["FAKE_AGENT_TOOL"] = f"({script}) > {shlex.quote(str(seen))}; echo done"
        command = shlex.join([sys.executable, str(FAKE_CODEX)])
    else:
        command = settings_reader(world, "codex-acp", script)
    with trio.fail_after(90):
        async with running_server() as server, running_harness(
            server, world.home, exec_command=command, brain=brain, env=env,
        ):
            first = await turn(server, "A")
            seen_first = (world.logs / "seen.txt").read_text()
            # The person changes their provider: the next run gets it.
            (person / "config.toml").write_text('model_provider = "other"\n')
            second = await turn(server, "B")
            seen_second = (world.logs / "seen.txt").read_text()
    assert first["ok"] is True and second["ok"] is True, (first, second)
    assert seen_first == 'model_provider = "mock"\n'
    assert seen_second == 'model_provider = "other"\n'
    assert (person / "config.toml").read_text() == 'model_provider = "other"\n'
    owned = world.home / "cli" / "default" / "codex" / "config.toml"
    # The run's own write stayed in its conversation's copy.
    owned = world.home / "cli" / "default" / "lanes"
    assert ["planted" in (lane / "codex" / "config.toml").read_text()
            for lane in sorted(owned.iterdir())] == [True, True]
