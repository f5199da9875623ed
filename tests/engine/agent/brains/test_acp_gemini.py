"""Gemini CLI's saved session kept loadable (prohost/engine/agent/brains/acp_gemini.py),
on folders laid out as Gemini CLI 0.61 leaves them (the real agent's turns are in
tests/harness/test_real_acp_agents.py)."""

from __future__ import annotations

import json
from pathlib import Path

from prohost.engine.agent.brains.acp_brain import AcpBrain
from prohost.engine.agent.brains.acp_gemini import keep_loadable
from prohost.engine.run.confine import RunConfinement
from prohost.engine.sandbox.confinement import Confinement

SESSION = "36398755-dc28-4647-8d9a-aec1bc63c291"


def chat_file(chats: Path, minute: str, session: str = SESSION, *,
              said: str = "first turn") -> Path:
    """A session file as Gemini CLI writes it: a header, then records."""
    chats.mkdir(parents=True, exist_ok=True)
    path = chats / f"session-2026-12-05T{minute}-{session[:8]}.jsonl"
    path.write_text(json.dumps({"sessionId": session, "projectHash": "ab",
                                "startTime": "2026-12-05T04:23:00Z", "kind": "main"}) + "\n"
                    + json.dumps({"id": "m1", "type": "user",
                                  "content": [{"text": said}]}) + "\n")
    return path


def test_the_session_file_is_renamed_out_of_the_minute_names(tmp_path: Path) -> None:
    chats = tmp_path / ".gemini" / "tmp" / "ws" / "chats"
    original = chat_file(chats, "04-23")
    text = original.read_text()
    other = chat_file(chats, "04-23", "6caedae4-0000-4000-8000-000000000000")

    kept = keep_loadable(tmp_path / ".gemini", SESSION)

    assert kept == chats / f"session-{SESSION}.jsonl"
    assert kept.read_text() == text  # nothing of the conversation is lost
    assert not original.exists()
    assert other.exists()  # another session's file is not touched
    # Once kept, later turns find it so and change nothing (a load's stray stays
    # for Gemini's own cleanup).
    stray = chat_file(chats, "04-24", said="")
    assert keep_loadable(tmp_path / ".gemini", SESSION) == kept
    assert stray.exists() and kept.read_text() == text


def test_of_several_files_by_minute_the_earliest_is_the_session(tmp_path: Path) -> None:
    """A session loaded before the harness kept it has the loads' strays beside it
    (a fresh header and the bare context), each named by a later minute."""
    chats = tmp_path / ".gemini" / "tmp" / "ws" / "chats"
    first = chat_file(chats, "04-23", said="first turn PELICAN")
    stray = chat_file(chats, "04-24", said="")
    text = first.read_text()

    kept = keep_loadable(tmp_path / ".gemini", SESSION)

    assert kept is not None and kept.read_text() == text
    assert stray.exists()


def test_a_file_of_another_session_with_the_same_short_id_stays(tmp_path: Path) -> None:
    chats = tmp_path / ".gemini" / "tmp" / "ws" / "chats"
    same_start = SESSION[:8] + "-ffff-4fff-8fff-ffffffffffff"
    theirs = chat_file(chats, "04-23", same_start)

    assert keep_loadable(tmp_path / ".gemini", SESSION) is None
    assert theirs.exists()


def test_no_link_is_followed_and_no_odd_id_names_a_file(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    original = chat_file(elsewhere, "04-23")
    project = tmp_path / ".gemini" / "tmp" / "ws"
    project.mkdir(parents=True)
    (project / "chats").symlink_to(elsewhere)

    assert keep_loadable(tmp_path / ".gemini", SESSION) is None
    assert original.exists()
    assert keep_loadable(tmp_path / ".gemini", "../" + SESSION) is None
    assert keep_loadable(tmp_path / "missing", SESSION) is None  # never raises


def test_the_brain_mends_gemini_sessions_only_where_the_harness_keeps_them(
    tmp_path: Path,
) -> None:
    """``before_spawn`` renames in the folder of the harness's that the run sees at
    ``~/.gemini`` (its confinement's ``kept_at``), for Gemini CLI alone."""
    person = tmp_path / "person"
    upper = tmp_path / "prohost" / "agents" / "gemini" / "C1" / ".gemini"
    original = chat_file(upper / "tmp" / "ws" / "chats", "04-23")
    confined = RunConfinement(Confinement(), tmp_path / "tmp",
                              own=((person / ".gemini", upper),))
    env = {"HOME": str(person)}

    AcpBrain("qwen --acp").before_spawn(SESSION, env, confined.kept_at)
    AcpBrain("gemini --acp").before_spawn(None, env, confined.kept_at)
    assert original.exists()

    AcpBrain("gemini --acp -m gemini-2.5-flash").before_spawn(SESSION, env, confined.kept_at)
    assert not original.exists()
    assert (upper / "tmp" / "ws" / "chats" / f"session-{SESSION}.jsonl").exists()
    assert not (person / ".gemini").exists()  # the person's folder is never written
