"""The default account's login, shared between the person's CLI folder and the
harness's own (issue 36, point 5): whichever copy is newer wins, at each run's
start and end, so that a refresh (which rotates the refresh token) on either side
never logs the other out; nothing but a credentials document is ever copied, and
no link is followed. Fake credentials files, real files."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from prohost.engine.accounts.logins import SharedLogin, seed_files, sync_login


def claude_doc(expires_at: int, refresh: str = "r1") -> str:
    return json.dumps({"claudeAiOauth": {
        "accessToken": f"a-{expires_at}", "refreshToken": refresh, "expiresAt": expires_at,
        "scopes": ["user:inference"], "subscriptionType": "max"}})


def codex_doc(last_refresh: str, refresh: str = "r1", account: str = "acct-1") -> str:
    return json.dumps({"OPENAI_API_KEY": None, "tokens": {
        "id_token": "i", "access_token": f"a-{last_refresh}", "refresh_token": refresh,
        "account_id": account}, "last_refresh": last_refresh})


@pytest.fixture
def claude(tmp_path: Path) -> SharedLogin:
    person = tmp_path / "user" / ".claude"
    person.mkdir(parents=True)
    harness = tmp_path / "home" / "cli" / "default" / "claude"
    harness.mkdir(parents=True)
    return SharedLogin("claude", person / ".credentials.json", harness / ".credentials.json")


@pytest.fixture
def codex(tmp_path: Path) -> SharedLogin:
    person = tmp_path / "user" / ".codex"
    person.mkdir(parents=True)
    harness = tmp_path / "home" / "cli" / "default" / "codex"
    harness.mkdir(parents=True)
    return SharedLogin("codex", person / "auth.json", harness / "auth.json")


def test_the_harness_s_copy_is_seeded_from_the_person_s_login(claude: SharedLogin) -> None:
    claude.person.write_text(claude_doc(1000))
    assert sync_login(claude) == "to harness"
    assert json.loads(claude.harness.read_text()) == json.loads(claude_doc(1000))
    assert stat.S_IMODE(os.stat(claude.harness).st_mode) == 0o600
    assert sync_login(claude) is None  # the same: nothing to do


def test_a_refresh_in_a_run_reaches_the_person_and_theirs_reaches_the_runs(
    claude: SharedLogin,
) -> None:
    """The round trip: the run's CLI refreshes (new refresh token, later expiry),
    the person's gets it at the run's end; the person's CLI refreshes later, the
    next run's start takes it. Neither side is left with a spent refresh token."""
    claude.person.write_text(claude_doc(1000, "r1"))
    sync_login(claude)
    # The run's Claude Code refreshes: a temporary file, then a rename.
    temporary = claude.harness.with_name(".credentials.json.tmp")
    temporary.write_text(claude_doc(2000, "r2"))
    temporary.rename(claude.harness)
    assert sync_login(claude) == "to person"
    assert json.loads(claude.person.read_text())["claudeAiOauth"]["refreshToken"] == "r2"
    assert stat.S_IMODE(os.stat(claude.person).st_mode) == 0o600
    claude.person.write_text(claude_doc(3000, "r3"))
    assert sync_login(claude) == "to harness"
    assert json.loads(claude.harness.read_text())["claudeAiOauth"]["refreshToken"] == "r3"


def test_codex_logins_are_compared_by_their_last_refresh(codex: SharedLogin) -> None:
    codex.person.write_text(codex_doc("2026-01-01T00:00:00Z", "r1"))
    assert sync_login(codex) == "to harness"
    codex.harness.write_text(codex_doc("2026-02-01T00:00:00.123456Z", "r2"))
    assert sync_login(codex) == "to person"
    assert json.loads(codex.person.read_text())["tokens"]["refresh_token"] == "r2"


def test_a_codex_login_of_another_account_never_reaches_the_person(codex: SharedLogin) -> None:
    """A run that writes a login of its own (another account) into the harness's
    folder does not log the person's Codex into it."""
    codex.person.write_text(codex_doc("2026-01-01T00:00:00Z", account="acct-1"))
    sync_login(codex)
    codex.harness.write_text(codex_doc("2027-01-01T00:00:00Z", account="acct-evil"))
    assert sync_login(codex) == "to harness"
    assert json.loads(codex.person.read_text())["tokens"]["account_id"] == "acct-1"
    assert json.loads(codex.harness.read_text())["tokens"]["account_id"] == "acct-1"


def test_a_link_in_the_harness_s_folder_is_never_followed_nor_copied(
    claude: SharedLogin, tmp_path: Path,
) -> None:
    """A run makes the harness's copy a link to a secret (or to a credentials file
    of its choosing elsewhere): nothing is read through it, and the person's file
    stays as it was; the link is replaced by the person's login."""
    secret = tmp_path / "user" / ".ssh" / "id_rsa"
    secret.parent.mkdir()
    secret.write_text(claude_doc(9999, "stolen"))
    claude.person.write_text(claude_doc(1000))
    claude.harness.symlink_to(secret)
    assert sync_login(claude) == "to harness"
    assert json.loads(claude.person.read_text()) == json.loads(claude_doc(1000))
    assert not claude.harness.is_symlink()
    assert json.loads(claude.harness.read_text()) == json.loads(claude_doc(1000))
    assert secret.read_text() == claude_doc(9999, "stolen")


@pytest.mark.parametrize("text", [
    "not json", json.dumps({"claudeAiOauth": {"accessToken": "a"}}), "[]",
    json.dumps({"claudeAiOauth": {"accessToken": "a", "refreshToken": "r",
                                  "expiresAt": 5000, "hooks": {"x": "y"}}}),
])
def test_anything_but_a_credentials_document_is_never_copied(
    claude: SharedLogin, text: str,
) -> None:
    claude.person.write_text(claude_doc(1000))
    sync_login(claude)
    claude.harness.write_text(text)
    assert sync_login(claude) == "to harness"
    assert json.loads(claude.person.read_text()) == json.loads(claude_doc(1000))


def test_a_person_without_a_login_file_keeps_none(claude: SharedLogin) -> None:
    """Logged out (or logged in by a variable): the harness never makes the
    person's file, and a copy it kept is left for its own runs."""
    claude.harness.write_text(claude_doc(1000))
    assert sync_login(claude) is None
    assert not claude.person.exists()


def test_only_the_login_part_is_copied_either_way(claude: SharedLogin) -> None:
    """The person's file also holds MCP servers' OAuth tokens: runs never get them.
    A run's copy with entries of its own: only its newer login reaches the person,
    whose other entries stay."""
    person = json.loads(claude_doc(1000))
    person["mcpOAuth"] = {"server": {"accessToken": "the person's MCP token"}}
    claude.person.write_text(json.dumps(person))
    assert sync_login(claude) == "to harness"
    assert json.loads(claude.harness.read_text()) == json.loads(claude_doc(1000))
    planted = json.loads(claude_doc(2000, "r2"))
    planted["mcpOAuth"] = {"evil": {"accessToken": "x"}}
    planted["hooks"] = {"PostToolUse": "curl evil"}
    claude.harness.write_text(json.dumps(planted))
    assert sync_login(claude) == "to person"
    shared = json.loads(claude.person.read_text())
    assert shared["claudeAiOauth"]["refreshToken"] == "r2"
    assert shared["mcpOAuth"] == person["mcpOAuth"] and "hooks" not in shared


def seeded(tmp_path: Path, **fields: object) -> SharedLogin:
    for side in ("person", "harness"):
        (tmp_path / side).mkdir(exist_ok=True)
    return SharedLogin("codex", tmp_path / "person" / "auth.json",
                       tmp_path / "harness" / "auth.json", seeds=("config.toml",),
                       **fields)  # type: ignore[arg-type]


def test_codex_s_config_is_seeded_one_way_when_the_person_s_is_newer(tmp_path: Path) -> None:
    login = seeded(tmp_path)
    person, harness = tmp_path / "person" / "config.toml", tmp_path / "harness" / "config.toml"
    person.write_text('model_provider = "mock"\n')
    assert seed_files(login) == ["config.toml"]
    assert harness.read_text() == 'model_provider = "mock"\n'
    assert stat.S_IMODE(os.stat(harness).st_mode) == 0o600
    # Written in the harness's copy later (by Codex or a run): kept, never sent back.
    harness.write_text("changed by a run\n")
    assert seed_files(login) == []
    assert person.read_text() == 'model_provider = "mock"\n'
    # The person's own change is newer: it replaces the harness's copy.
    later = os.stat(harness).st_mtime_ns + 10**9
    person.write_text('model_provider = "other"\n')
    os.utime(person, ns=(later, later))
    assert seed_files(login) == ["config.toml"]
    assert harness.read_text() == 'model_provider = "other"\n'


def test_a_linked_config_or_one_in_a_secret_store_is_never_seeded(tmp_path: Path) -> None:
    cargo = tmp_path / "user" / ".cargo"
    cargo.mkdir(parents=True)
    (cargo / "credentials.toml").write_text('token = "secret"\n')
    login = seeded(tmp_path)
    (tmp_path / "person" / "config.toml").symlink_to(cargo / "credentials.toml")
    assert seed_files(login) == []
    assert not (tmp_path / "harness" / "config.toml").exists()
    # The person's whole folder a link into the secret store.
    (tmp_path / "person" / "config.toml").unlink()
    (tmp_path / "person").rmdir()
    (tmp_path / "person").symlink_to(cargo)
    (cargo / "config.toml").write_text('token = "secret"\n')
    hidden = seeded(tmp_path, hidden=(cargo,))
    assert seed_files(hidden) == []
    assert not (tmp_path / "harness" / "config.toml").exists()
