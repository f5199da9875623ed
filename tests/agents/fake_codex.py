"""A fake ``codex`` CLI speaking ``codex exec --json``'s JSON lines.

The shapes are those of openai/codex ``codex-rs/exec/src/exec_events.rs`` as
serde prints them: compact, the item's ``id`` before its ``type`` tag, every
field present (``null`` when unset), including fields prohost does not read.

Behaviour comes from ``FAKE_CODEX_SCENARIO`` (default ``reply``):

- ``reply``: thread.started, turn.started, a reasoning item, an agent_message, turn.completed
- ``tool``: a command_execution item (started, then completed with exit code 0), then a reply
- ``failed``: an error event and turn.failed, exit 1
- ``no_rollout``: with ``exec resume <id>``, codex's resume error on stderr and exit 1
  before thread.started; otherwise like ``reply``
- ``huge_line``: a command_execution whose aggregated_output is 5 MiB, then a reply
- ``noise``: the ``reply`` events with non-JSON lines between them
- ``errors_forever``: error lines on stderr until killed
- ``lone_surrogate``: like ``reply``, the reply ending in the JSON escape of half an
  emoji (``\\ud83d``; serde_json would never write one, but the reader is shared)
- ``bad_byte``: like ``reply``, the reply holding a byte that is not UTF-8 (0xFF)

Per account, driven by the folder in ``CODEX_HOME`` (what prohost sets for an
account), whatever the scenario:

- a file ``limit`` holding a reset epoch makes this account answer the way codex
  exec does at its usage limit: thread.started, turn.started, then an ``error`` and a
  ``turn.failed`` both saying ``You've hit your usage limit. Try again at 8:05 PM.``
  (the local time; ``Sep 3rd, 2025 4:05 PM`` on another day), exit 1.
- a file ``used_percent`` (a number) adds a ``token_count`` event with those
  rate-limit figures before the reply.
- a file ``fail_turn`` (removed as it is read) makes this one turn fail after some
  work: a command item, an ``error`` and a ``turn.failed``, exit 1. Like codex, it
  prints no usage for a failed turn (no ``turn.completed``), while the thread's
  rollout file still counts the turn's tokens, so the next ``turn.completed``'s
  running totals include them. Holding ``big``, a 300 KiB command output is recorded
  in the rollout file after the turn's token count.
- a file ``hang_turn`` (removed as it is read) makes this one turn do the same work
  (its tokens counted in the rollout file) and then hang until it is killed (a
  run's timeout, a cancel); ``big`` as for ``fail_turn``. With ``FAKE_CODEX_GATE``
  (a port on 127.0.0.1), once that work is all in the rollout file, it connects
  there and says ``start <run id> <pid>`` (the Turnstile of tests/kits/fake_clis.py),
  so that a test stops it only while it hangs; it exits 3 if the test goes away.

With ``CODEX_HOME`` set, threads live there as codex keeps them: a new thread (a
fresh id) writes its session rollout file
``sessions/YYYY/MM/DD/rollout-YYYY-MM-DDThh-mm-ss-<id>.jsonl`` (``precompute_log_file_info``
in openai/codex ``codex-rs/core/src/rollout/recorder.rs``), its first line a
``session_meta``, and ``exec resume <id>`` of a thread with no such file fails like
codex's "no rollout found". Each model response appends a ``token_count`` event
with the thread's running totals (``RolloutLine``/``RolloutItem::EventMsg``/
``TokenCountEvent`` of ``codex-rs/protocol/src/protocol.rs``), and ``turn.completed``
reports those totals, as codex does. The ``[mcp_servers.prohost]`` table of
``$CODEX_HOME/config.toml`` is recorded as ``mcp_server`` (how codex would call the
run's MCP server).

``FAKE_CODEX_REPLY`` replaces the reply text. When ``FAKE_CODEX_RECORD`` names a
file, the arguments, the prompt and a few variables of every invocation are
appended to the JSON list in it.
``FAKE_CODEX_REFUSE`` names a file: while it exists, every invocation (recorded
first) refuses to start the way clap refuses a flag it does not know, before any
event: ``error: unexpected argument '<the file's content>' found``, exit 2.
Arguments are checked the way codex's parser would: an unknown flag or a missing
option value exits 2 with a clap-style message.
``FAKE_AGENT_TOOL`` is a shell command line the fake runs as its shell tool would,
a child of its own process; what it prints (stripped) is the reply.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
import tomllib
import uuid
from typing import NoReturn

from gate_client import announce
from json_lines import BAD_BYTE, LONE_SURROGATE, emit

THREAD_ID = "0199a213-81c0-7800-8aa1-bbab2a035a53"
RECORDED_ENV = ("PROHOST_RUN_ID", "PROHOST_PAIRED_RUN", "PROHOST_MCP_TOKEN")

# codex exec's options (cli.rs and the shared options it flattens in).
WITH_VALUE = {
    "-c", "--config", "-m", "--model", "-s", "--sandbox", "-C", "--cd", "-p", "--profile",
    "-o", "--output-last-message", "-i", "--image", "--color", "--output-schema",
    "--add-dir", "--local-provider",
}
SWITCHES = {
    "--json", "--experimental-json", "--skip-git-repo-check", "--ephemeral",
    "--dangerously-bypass-approvals-and-sandbox", "--yolo", "--full-auto", "--oss",
    "--last", "--all",
}


def usage_error(message: str) -> None:
    sys.stderr.write(f"error: {message}\n\nFor more information, try '--help'.\n")
    sys.exit(2)


def parse(argv: list[str]) -> dict[str, object]:
    """What clap would make of ``argv``: subcommands, flags, positionals."""
    if argv[:1] == ["--version"]:
        print("codex-cli 0.0.0-fake")
        sys.exit(0)
    flags: list[str] = []
    positionals: list[str] = []
    index = 0
    while index < len(argv):
        word = argv[index]
        if word == "-" or not word.startswith("-"):
            positionals.append(word)
        elif word.split("=", 1)[0] in WITH_VALUE:
            if "=" not in word:
                index += 1
                if index >= len(argv):
                    usage_error(f"a value is required for '{word} <VALUE>' but none was supplied")
        elif word in SWITCHES:
            flags.append(word)
        else:
            usage_error(f"unexpected argument '{word}' found")
        index += 1
    if positionals[:1] in (["exec"], ["e"]):
        positionals = positionals[1:]
    resume: str | None = None
    if positionals[:1] == ["resume"]:
        if len(positionals) < 2:
            usage_error("resume needs a SESSION_ID or --last")
        resume = positionals[1]
        positionals = positionals[2:]
    if len(positionals) > 1:
        usage_error(f"unexpected argument '{positionals[1]}' found")
    return {"flags": flags, "resume": resume, "prompt_arg": positionals[0] if positionals else None}




#: What one turn uses here; turn.completed reports the thread's running totals.
TURN_USAGE = {"input_tokens": 1200, "cached_input_tokens": 200, "output_tokens": 345}


def rollout_path(thread_id: str) -> str | None:
    """The thread's rollout file in ``$CODEX_HOME`` (``None``: no CODEX_HOME, or no
    such thread)."""
    home = os.environ.get("CODEX_HOME")
    if not home:
        return None
    found = sorted(glob.glob(os.path.join(home, "sessions", "*", "*", "*",
                                          f"rollout-*-{thread_id}.jsonl")))
    return found[-1] if found else None


def new_rollout(home: str, thread_id: str) -> None:
    """A new thread's rollout file, where and as codex writes it."""
    now = time.localtime()
    folder = os.path.join(home, "sessions", time.strftime("%Y", now),
                          time.strftime("%m", now), time.strftime("%d", now))
    os.makedirs(folder, exist_ok=True)
    name = f"rollout-{time.strftime('%Y-%m-%dT%H-%M-%S', now)}-{thread_id}.jsonl"
    with open(os.path.join(folder, name), "w", encoding="utf-8") as rollout:
        rollout.write(rollout_line("session_meta", {
            "id": thread_id, "timestamp": stamp(), "cwd": os.getcwd(),
            "originator": "codex_exec", "cli_version": "0.0.0-fake", "source": "exec",
            "model_provider": "openai"}))


def stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())


def rollout_line(kind: str, payload: dict[str, object]) -> str:
    """One ``RolloutLine``: a timestamp and a ``RolloutItem`` tagged type/payload."""
    return json.dumps({"timestamp": stamp(), "type": kind, "payload": payload},
                      separators=(",", ":")) + "\n"


def token_usage(input_tokens: int, cached: int, output: int) -> dict[str, int]:
    """``TokenUsage`` as serde prints it."""
    return {"input_tokens": input_tokens, "cached_input_tokens": cached,
            "output_tokens": output, "reasoning_output_tokens": 0,
            "total_tokens": input_tokens + output}


def running_totals(thread_id: str) -> dict[str, int]:
    """The thread's totals after this turn's model response, as turn.completed
    carries them (openai/codex ``usage_from_last_total``, issue #17539): with
    ``CODEX_HOME``, the last ``token_count`` of the thread's rollout file plus this
    response's usage, appended to the file as codex does; without it, one turn's."""
    path = rollout_path(thread_id)
    if path is None:
        return dict(TURN_USAGE)
    totals = {key: 0 for key in TURN_USAGE}
    with open(path, "a+", encoding="utf-8") as rollout:
        rollout.seek(0)
        for line in rollout:
            event = json.loads(line)
            payload = event.get("payload") or {}
            if event.get("type") == "event_msg" and payload.get("type") == "token_count" \
                    and payload.get("info"):
                total = payload["info"]["total_token_usage"]
                totals = {key: total[key] for key in TURN_USAGE}
        totals = {key: totals[key] + TURN_USAGE[key] for key in TURN_USAGE}
        last = token_usage(TURN_USAGE["input_tokens"], TURN_USAGE["cached_input_tokens"],
                           TURN_USAGE["output_tokens"])
        rollout.write(rollout_line("event_msg", {
            "type": "token_count",
            "info": {"total_token_usage": token_usage(totals["input_tokens"],
                                                      totals["cached_input_tokens"],
                                                      totals["output_tokens"]),
                     "last_token_usage": last, "model_context_window": 272000},
            "rate_limits": None}))
    return totals


def big_output(thread_id: str) -> None:
    """A command's 300 KiB output recorded after the turn's token count (a
    ``response_item``: ``ResponseItem::FunctionCallOutput``), so that the count is no
    longer in the rollout file's last 256 KiB."""
    path = rollout_path(thread_id)
    assert path is not None
    with open(path, "a", encoding="utf-8") as rollout:
        rollout.write(rollout_line("response_item", {
            "type": "function_call_output", "call_id": "call_1",
            "output": "x" * (300 * 1024)}))


def reply_events(thread_id: str, reply: str, *, first_item: int = 0) -> list[dict[str, object]]:
    return [
        {"type": "item.completed", "item": {
            "id": f"item_{first_item}", "type": "reasoning",
            "text": "**Reading the request**\n\nLooking at what was asked."}},
        {"type": "item.completed", "item": {
            "id": f"item_{first_item + 1}", "type": "agent_message", "text": reply}},
        {"type": "turn.completed", "usage": running_totals(thread_id)},
    ]


def command_item(item_id: str, command: str, output: str, exit_code: int | None,
                 status: str) -> dict[str, object]:
    return {"id": item_id, "type": "command_execution", "command": command,
            "aggregated_output": output, "exit_code": exit_code, "status": status}


def account_file(name: str) -> str | None:
    """The stripped content of ``name`` in this account's folder, if there: the
    ``--account`` folder prohost names in ``PROHOST_ACCOUNT_DIR`` (each conversation
    has a ``CODEX_HOME`` of its own), else ``CODEX_HOME``."""
    folder = os.environ.get("PROHOST_ACCOUNT_DIR") or os.environ.get("CODEX_HOME")
    if not folder:
        return None
    try:
        with open(os.path.join(folder, name), encoding="utf-8") as file:
            return file.read().strip()
    except OSError:
        return None


def mcp_server() -> object:
    """The ``[mcp_servers.prohost]`` table of ``$CODEX_HOME/config.toml``, if any."""
    text = account_file("config.toml")
    if text is None:
        return None
    try:
        return tomllib.loads(text).get("mcp_servers", {}).get("prohost")
    except tomllib.TOMLDecodeError as exc:
        return {"error": str(exc)}


def retry_time(epoch: int) -> str:
    """``format_retry_timestamp`` of openai/codex ``codex-rs/core/src/error.rs``:
    ``%-I:%M %p`` on the same local day, else ``%b %-d<suffix>, %Y %-I:%M %p``."""
    moment = time.localtime(epoch)
    half = "AM" if moment.tm_hour < 12 else "PM"
    clock = f"{moment.tm_hour % 12 or 12}:{moment.tm_min:02d} {half}"
    if time.strftime("%Y-%m-%d", moment) == time.strftime("%Y-%m-%d", time.localtime()):
        return clock
    day = moment.tm_mday
    suffix = "th" if 11 <= day <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{time.strftime('%b', moment)} {day}{suffix}, {moment.tm_year} {clock}"


def hang() -> NoReturn:
    """Hang until killed. With ``FAKE_CODEX_GATE``, tell the test first that the
    turn's work is done and it hangs now: a test that stops it once it hears so never
    stops it halfway through that work (say between the token count and the big
    output after it), whatever the load. A test that goes away ends it (exit 3)."""
    if gate := os.environ.get("FAKE_CODEX_GATE"):
        with announce(int(gate)) as conn:
            conn.recv(1)  # until the test closes its end; a stop kills it first
        sys.exit(3)
    while True:
        time.sleep(1)


def main() -> None:
    args = parse(sys.argv[1:])
    prompt = sys.stdin.read() if args["prompt_arg"] in (None, "-") else str(args["prompt_arg"])
    record = os.environ.get("FAKE_CODEX_RECORD")
    if record:
        # One entry per invocation, so a test can see every attempt of a run.
        entries = []
        if os.path.exists(record):
            with open(record, encoding="utf-8") as file:
                entries = json.load(file)
        entries.append({
            "argv": sys.argv[1:],
            "prompt": prompt,
            "env": {name: os.environ.get(name) for name in RECORDED_ENV},
            "codex_home": os.environ.get("CODEX_HOME"),
            "mcp_server": mcp_server(),
        })
        with open(record, "w", encoding="utf-8") as file:
            json.dump(entries, file)
    refuse = os.environ.get("FAKE_CODEX_REFUSE")
    if refuse and os.path.exists(refuse):
        with open(refuse, encoding="utf-8") as file:
            usage_error(f"unexpected argument '{file.read().strip()}' found")

    scenario = os.environ.get("FAKE_CODEX_SCENARIO", "reply")
    reply = os.environ.get("FAKE_CODEX_REPLY", "Fixed: the fixture path was wrong.")
    if tool := os.environ.get("FAKE_AGENT_TOOL"):
        # What its shell tool prints, run as the real CLI runs one: a child of it.
        reply = subprocess.run(["/bin/sh", "-c", tool], capture_output=True, text=True,
                               check=False).stdout.strip()
    if scenario == "lone_surrogate":
        reply += " " + LONE_SURROGATE
    elif scenario == "bad_byte":
        reply += " " + BAD_BYTE
    resume = args["resume"]
    thread_id = str(resume) if resume else THREAD_ID
    home = os.environ.get("CODEX_HOME")
    if home:
        if resume and rollout_path(str(resume)) is None:
            sys.stderr.write(
                f"Error: thread/resume: thread/resume failed: no rollout found for thread "
                f"id {resume} (code -32600)\n"
            )
            sys.exit(1)
        if not resume:
            thread_id = str(uuid.uuid4())
            new_rollout(home, thread_id)

    if scenario == "errors_forever":
        while True:
            sys.stderr.write(
                "2025-10-28T12:00:00.000000Z ERROR codex_core::codex: stream error: "
                "stream disconnected before completion; retrying\n"
            )
            sys.stderr.flush()
            time.sleep(0.01)
    if scenario == "no_rollout" and resume:
        # What codex-cli 0.130 prints for a thread it has no rollout file for.
        sys.stderr.write(
            f"Error: thread/resume: thread/resume failed: no rollout found for thread id "
            f"{resume} (code -32600)\n"
        )
        sys.exit(1)

    emit({"type": "thread.started", "thread_id": thread_id})
    emit({"type": "turn.started"})
    limit = account_file("limit")
    if limit is not None:
        message = f"You've hit your usage limit. Try again at {retry_time(int(limit))}."
        emit({"type": "error", "message": message})
        emit({"type": "turn.failed", "error": {"message": message}})
        sys.exit(1)
    used = account_file("used_percent")
    if used is not None:
        # The protocol Event older `codex exec --json` printed for every model call
        # (EventMsg::TokenCount / RateLimitSnapshot in codex-rs/protocol/src/protocol.rs).
        emit({"id": "0", "msg": {"type": "token_count", "info": None, "rate_limits": {
            "primary": {"used_percent": float(used), "window_minutes": 300,
                        "resets_at": int(time.time()) + 3600},
            "secondary": {"used_percent": 12.0, "window_minutes": 10080,
                          "resets_at": int(time.time()) + 86400 * 5}}}})
    failing = account_file("fail_turn")
    if failing is not None:
        os.remove(os.path.join(os.environ["CODEX_HOME"], "fail_turn"))
        command = "/bin/bash -lc 'pytest -q'"
        emit({"type": "item.started",
              "item": command_item("item_0", command, "", None, "in_progress")})
        emit({"type": "item.completed",
              "item": command_item("item_0", command, "3 passed in 0.01s\n", 0, "completed")})
        running_totals(thread_id)  # the thread counts the turn; the stream does not
        if failing == "big":
            big_output(thread_id)
        message = "stream disconnected before completion: Connection reset by peer"
        emit({"type": "error", "message": message})
        emit({"type": "turn.failed", "error": {"message": message}})
        sys.exit(1)
    hanging = account_file("hang_turn")
    if hanging is not None:
        os.remove(os.path.join(os.environ["CODEX_HOME"], "hang_turn"))
        command = "/bin/bash -lc 'pytest -q'"
        emit({"type": "item.started",
              "item": command_item("item_0", command, "", None, "in_progress")})
        running_totals(thread_id)
        if hanging == "big":
            big_output(thread_id)
        hang()
    if scenario == "failed":
        message = "You've hit your usage limit. Try again later."
        emit({"type": "error", "message": message})
        emit({"type": "turn.failed", "error": {"message": message}})
        sys.exit(1)
    if scenario == "tool":
        command = "/bin/bash -lc 'pytest -q'"
        emit({"type": "item.started",
              "item": command_item("item_0", command, "", None, "in_progress")})
        emit({"type": "item.completed",
              "item": command_item("item_0", command, "3 passed in 0.01s\n", 0, "completed")})
        events = reply_events(thread_id, reply, first_item=1)
    elif scenario == "huge_line":
        command = "/bin/bash -lc 'cat big.log'"
        emit({"type": "item.started",
              "item": command_item("item_0", command, "", None, "in_progress")})
        emit({"type": "item.completed",
              "item": command_item("item_0", command, "x" * (5 * 1024 * 1024), 0, "completed")})
        events = reply_events(thread_id, reply, first_item=1)
    else:
        events = reply_events(thread_id, reply)
    for event in events:
        if scenario == "noise":
            sys.stdout.write("Reading prompt from stdin...\n\n[1, 2]\n{not json\n")
        emit(event)


if __name__ == "__main__":
    main()
